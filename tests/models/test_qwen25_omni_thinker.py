"""The Qwen2.5-Omni thinker (text in) on our hot path, against transformers' thinker.

One checkpoint in the real layout (`omnistage.families.qwen25_omni.tiny`); the stage
loads only its part (`model_part="thinker"`: `thinker.model.*`, `thinker.lm_head.*`).
For text-only input the thinker's three mrope rows are equal, so its rotary
embedding reduces to ordinary RoPE (theta 1e6). transformers computes RMSNorm and
the rotary tables in float32 even for a float64 model, hence the tolerances.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from omnistage import LLM, SamplingParams
from omnistage.families.qwen25_omni.tiny import make_tiny_qwen25_omni
from omnistage.families.qwen25_omni.tiny_config import (
    CODEC_IDS,
    SPEAKER_COND_DIM,
    TALKER_VOCAB_SIZE,
    TTS_TEXT_IDS,
)
from omnistage.families.qwen25_omni.tiny_processor import (
    IM_END_ID,
    SPEAKER_BOS,
    THINKER_VOCAB_SIZE,
    TOKEN_IDS,
)

PROMPTS = [[5, 17, 33, 9, 100], list(range(40, 77)), [7] * 3]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_qwen25_omni(tmp_path_factory.mktemp("qwen25-omni"), dtype=torch.float64)


@pytest.fixture(scope="module")
def reference(ckpt):
    from transformers import Qwen2_5OmniForConditionalGeneration

    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float64)
    return model.thinker.eval()


def test_checkpoint_layout_ids_and_speakers(ckpt, tmp_path):
    from transformers import AutoTokenizer

    config = json.loads((ckpt / "config.json").read_text())
    assert config["model_type"] == "qwen2_5_omni"
    assert {"thinker_config", "talker_config", "token2wav_config"} <= config.keys()
    with safe_open(ckpt / "model.safetensors", "pt") as f:
        names = set(f.keys())
        dtypes = {n.split(".")[0]: f.get_slice(n).get_dtype() for n in names}
    assert {n.split(".")[0] for n in names} == {"thinker", "talker", "token2wav"}
    assert {".".join(n.split(".")[:2]) for n in names} == {
        "thinker.model",
        "thinker.lm_head",
        "thinker.audio_tower",
        "thinker.visual",
        "talker.thinker_to_talker_proj",
        "talker.model",
        "talker.codec_head",
        "token2wav.code2wav_dit_model",
        "token2wav.code2wav_bigvgan_model",
    }
    assert dtypes == {"thinker": "F64", "talker": "F64", "token2wav": "F32"}

    tok = AutoTokenizer.from_pretrained(ckpt)
    ids = tok.convert_tokens_to_ids
    thinker, talker = config["thinker_config"], config["talker_config"]
    assert thinker["text_config"]["vocab_size"] == THINKER_VOCAB_SIZE >= len(tok)
    assert tok.eos_token_id == IM_END_ID and ids("<|im_start|>") == 1
    newline = tok("\n")["input_ids"]
    for role in ("system", "user", "assistant"):
        assert tok(f"<|im_start|>{role}\n")["input_ids"] == [1, ids(role), *newline]
    for cfg in (thinker, talker):
        assert cfg["audio_token_index"] == ids("<|AUDIO|>") == tok.audio_token_id
        assert cfg["image_token_index"] == ids("<|IMAGE|>") == tok.image_token_id
        assert cfg["video_token_index"] == ids("<|VIDEO|>") == tok.video_token_id
        assert cfg["audio_start_token_id"] == ids("<|audio_bos|>")
        assert cfg["vision_start_token_id"] == ids("<|vision_bos|>")
    assert thinker["user_token_id"] == ids("user")
    for key, value in TTS_TEXT_IDS.items():
        assert talker[key] == value < len(tok)
    assert TOKEN_IDS["<tts_text_eod>"] == talker["tts_text_end_token_id"]
    assert talker["embedding_size"] == thinker["text_config"]["hidden_size"]
    assert talker["vocab_size"] == TALKER_VOCAB_SIZE
    for key, value in CODEC_IDS.items():
        assert talker[key] == value < TALKER_VOCAB_SIZE

    speakers = torch.load(ckpt / "spk_dict.pt", weights_only=True)
    assert set(speakers) == {"Chelsie", "Ethan"}
    dit = config["token2wav_config"]["dit_config"]
    for name, spk in speakers.items():
        assert spk["bos_token"] == SPEAKER_BOS[name] < THINKER_VOCAB_SIZE
        assert spk["cond"].shape == (1, dit["enc_emb_dim"]) == (1, SPEAKER_COND_DIM)
        assert spk["ref_mel"].ndim == 3 and spk["ref_mel"].shape[::2] == (1, dit["mel_dim"])

    again = make_tiny_qwen25_omni(tmp_path / "again", dtype=torch.float64)
    assert (again / "model.safetensors").read_bytes() == (ckpt / "model.safetensors").read_bytes()


def test_thinker_logits_and_greedy_tokens_match_transformers(ckpt, reference):
    llm = LLM(str(ckpt), model_part="thinker", dtype="float64", async_scheduling=False)
    runner = llm.engine.core.executor.runner
    seen: list[torch.Tensor] = []
    runner.add_sample_observer(lambda event: seen.append(event.logits))
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in PROMPTS],
        SamplingParams(temperature=0, max_tokens=16, min_tokens=16),
        use_tqdm=False,
    )
    first_step = seen[0]
    for i, prompt in enumerate(PROMPTS):
        with torch.no_grad():
            ref = reference(input_ids=torch.tensor([prompt])).logits[0, -1]
        torch.testing.assert_close(first_step[i].double(), ref, rtol=1e-4, atol=1e-4)
        generated = reference.generate(
            torch.tensor([prompt]),
            max_new_tokens=16,
            min_new_tokens=16,
            do_sample=False,
            pad_token_id=0,
        )
        assert outs[i].outputs[0].token_ids == generated[0, len(prompt) :].tolist()


def test_thinker_stage_rows_are_what_the_talker_is_built_from(ckpt, reference):
    """With `output_hidden_states`, the thinker stage reports per computed position (prompt,
    then every output but the last) its input embedding and final normed hidden state,
    side by side: transformers' `hidden_states[0]` and `hidden_states[-1]`."""
    from omnistage.config import EngineConfig
    from omnistage.engine.llm_engine import LLMEngine

    engine = LLMEngine(
        EngineConfig(
            model=str(ckpt),
            model_part="thinker",
            dtype="float64",
            async_scheduling=False,
            output_hidden_states=True,
            max_num_batched_tokens=16,  # a chunked prefill
        )
    )
    rows: list[torch.Tensor] = []
    engine.core_output_listener = lambda rid, out: rows.append(out.hidden_states)
    prompt = list(range(40, 77))
    engine.add_tokenized_request("r", None, prompt, SamplingParams(temperature=0, max_tokens=6))
    outputs = []
    while engine.has_unfinished_requests():
        outputs.extend(engine.step())
    output_ids = outputs[-1].outputs[0].token_ids
    got = torch.cat(rows)
    with torch.no_grad():
        states = reference(
            input_ids=torch.tensor([prompt + output_ids[:-1]]), output_hidden_states=True
        ).hidden_states
    hidden = reference.config.text_config.hidden_size
    assert got.shape == (len(prompt) + len(output_ids) - 1, 2 * hidden)
    torch.testing.assert_close(got[:, :hidden], states[0][0], rtol=0, atol=0)
    torch.testing.assert_close(got[:, hidden:], states[-1][0], rtol=1e-5, atol=1e-5)


def test_unknown_part_is_named(ckpt):
    with pytest.raises(
        ValueError, match="model_part: 'qwen2_5_omni' checkpoints have no part 'mouth'"
    ):
        LLM(str(ckpt), model_part="mouth", async_scheduling=False)
