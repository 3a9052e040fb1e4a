"""The Qwen2.5-Omni talker (a part of the real checkpoint) on our hot path, and its input
as transformers' `generate` assembles it.

- For the same (thinker-width) input embeddings, the same codec logits as transformers'
  talker (`thinker_to_talker_proj`, decoder, `codec_head`), `tts_codec_start` suppressed.
- `qwen25_talker_inputs` reproduces, row for row, what `generate` feeds the talker
  (captured at the input of `thinker_to_talker_proj`: the prefill rows, then per decode
  step the codec embedding of the last code plus one reply row). transformers 5.23's
  `generate` drops the all-ones attention mask, so its talker never adds the codec rows
  of the last two prompt positions for an unpadded request (`codec_rows=False`
  reproduces that); given a mask, its talker adds them (`codec_rows=True`, our default).
- Fed those inputs, our talker stage writes the same greedy codes as transformers'
  talker inside `generate` (repetition penalty 1.05 over the prompt's codec ids and the
  codes, `tts_codec_start` suppressed).

This talker's inputs have the thinker's width (`embedding_size`, 64 here, 3584 for the
real model), not its hidden size (32, real 896), as in transformers: the engine checks
`prompt_embeds` and conditioning rows against `Qwen25OmniTalker.input_width_for(config)`.
"""

from __future__ import annotations

import pytest
import torch

from omnistage import SamplingParams
from omnistage.config import EngineConfig
from omnistage.engine.llm_engine import LLMEngine
from omnistage.families.qwen25_omni.model import Qwen25TalkerSpecials, qwen25_talker_inputs
from omnistage.families.qwen25_omni.tiny import make_tiny_qwen25_omni
from omnistage.families.qwen25_omni.tiny_config import CODEBOOK_SIZE, CODEC_IDS, TALKER_EOS_IDS
from omnistage.families.qwen25_omni.tiny_processor import IM_END_ID, SPEAKER_BOS

CHAT = [
    {"role": "system", "content": "You are a tiny test model."},
    {"role": "user", "content": "Say something."},
]
CODEC_START = CODEC_IDS["tts_codec_start_token_id"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_qwen25_omni(tmp_path_factory.mktemp("qwen25-omni-talker"), dtype=torch.float64)


@pytest.fixture(scope="module")
def model(ckpt):
    from transformers import Qwen2_5OmniForConditionalGeneration

    return Qwen2_5OmniForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float64).eval()


def talker_engine(ckpt) -> LLMEngine:
    engine = LLMEngine(
        EngineConfig(model=str(ckpt), model_part="talker", dtype="float64", async_scheduling=False)
    )
    assert engine.input_width == engine.core.executor.runner.model.input_width
    return engine


def record_logits(engine: LLMEngine) -> list[torch.Tensor]:
    runner = engine.core.executor.runner
    seen: list[torch.Tensor] = []
    runner.add_sample_observer(lambda event: seen.append(event.logits))
    return seen


def test_talker_decoder_logits_match_transformers(ckpt, model):
    ref = model.talker
    engine = talker_engine(ckpt)
    assert engine.core.executor.runner.model.input_width == ref.config.embedding_size
    assert ref.config.embedding_size != ref.config.hidden_size
    seen = record_logits(engine)
    g = torch.Generator().manual_seed(0)
    width = ref.config.embedding_size
    embeds = [torch.randn(n, width, generator=g, dtype=torch.float64) for n in (9, 17, 4)]
    for i, e in enumerate(embeds):
        engine.add_tokenized_request(
            f"r{i}", None, [5] * e.shape[0], SamplingParams(temperature=0, max_tokens=1), e
        )
    while engine.has_unfinished_requests():
        engine.step()
    (logits,) = seen
    assert logits.shape[-1] == ref.config.vocab_size
    keep = torch.arange(ref.config.vocab_size) != CODEC_START
    for i, e in enumerate(embeds):
        with torch.no_grad():
            hidden = ref.model(inputs_embeds=ref.thinker_to_talker_proj(e[None])).last_hidden_state
            expected = ref.codec_head(hidden)[0, -1]
        torch.testing.assert_close(logits[i, keep].double(), expected[keep], rtol=1e-4, atol=1e-4)
        assert logits[i, CODEC_START] == float("-inf")


def reference_run(model, ckpt, max_codes: int):
    """transformers' `generate` (greedy, token2wav skipped), with what reaches the talker's
    `thinker_to_talker_proj`."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ckpt)
    inputs = tok.apply_chat_template(
        CHAT, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    fed: list[torch.Tensor] = []
    hook = model.talker.thinker_to_talker_proj.register_forward_pre_hook(
        lambda module, args: fed.append(args[0][0].clone())
    )
    talker_out: list[torch.Tensor] = []
    generate = model.talker.generate

    def recording_generate(*args, **kwargs):
        talker_out.append(generate(*args, **kwargs))
        return talker_out[-1]

    model.talker.generate = recording_generate
    model.token2wav.forward = lambda code, **kwargs: torch.zeros(1)  # not needed here
    try:
        seq, _ = model.generate(
            **inputs,
            thinker_max_new_tokens=8,
            talker_max_new_tokens=max_codes,
            talker_do_sample=False,
            thinker_eos_token_id=IM_END_ID,
        )
    finally:
        hook.remove()
        del model.talker.generate, model.token2wav.forward
    prompt_ids = inputs["input_ids"][0].tolist()
    output_ids = seq[0, len(prompt_ids) :].tolist()
    codes = talker_out[0][0, len(prompt_ids) + 2 :].tolist()
    return prompt_ids, output_ids, fed, codes


def thinker_rows(model, prompt_ids, output_ids):
    """Per thinker position (prompt + outputs but the last): input embedding and final
    normed hidden state, from one forward of transformers' thinker."""
    seq = torch.tensor([prompt_ids + output_ids[:-1]])
    with torch.no_grad():
        hidden_states = model.thinker(input_ids=seq, output_hidden_states=True).hidden_states
    return hidden_states[0][0], hidden_states[-1][0]


def test_talker_inputs_match_transformers_generate(model, ckpt):
    prompt_ids, output_ids, fed, codes = reference_run(model, ckpt, max_codes=12)
    assert len(output_ids) >= 3 and len(codes) == 12 and len(set(codes)) > 1
    embeds, hidden = thinker_rows(model, prompt_ids, output_ids)
    specials = Qwen25TalkerSpecials.from_checkpoint(ckpt, torch.float64)
    inputs = qwen25_talker_inputs(
        embeds, hidden, prompt_ids, output_ids, specials, codec_rows=False
    )

    p = len(prompt_ids)
    assert inputs.prompt_token_ids == [CODEC_IDS["tts_codec_mask_token_id"]] * p + [
        CODEC_IDS["tts_codec_pad_token_id"],
        CODEC_START,
    ]
    # Prefill: the whole prompt (system turn included), speaker bos + codec_pad, out[0] +
    # codec_start. One thinker forward vs. transformers' incremental decode: ~1e-15.
    assert fed[0].shape == inputs.prompt_embeds.shape == (p + 2, embeds.shape[1])
    torch.testing.assert_close(inputs.prompt_embeds, fed[0], rtol=0, atol=1e-10)
    # Decode step s: codec embedding of code s + reply row s (then tts_text_end, then
    # tts_text_pad for ever); the talker wrote more codes than the reply has rows.
    assert inputs.conditioning.shape[0] == len(output_ids) - 1 < len(codes) - 1
    codec_table = model.talker.model.embed_tokens.weight
    for step, row in enumerate(fed[1:]):
        expected = codec_table[codes[step]] + inputs.step_row(step)
        torch.testing.assert_close(row[0], expected, rtol=0, atol=1e-10)
    assert len(fed) == len(codes)  # the last code is sampled, never fed back

    # Given an attention mask (as `generate` intends, and as rows of a left-padded batch
    # get it), transformers' talker adds `tts_codec_pad` / `tts_codec_start` to the last two
    # prompt rows itself: the default `codec_rows=True` prompt.
    intended = qwen25_talker_inputs(embeds, hidden, prompt_ids, output_ids, specials)
    assert not torch.equal(intended.prompt_embeds, inputs.prompt_embeds)
    torch.testing.assert_close(intended.conditioning, inputs.conditioning, rtol=0, atol=0)
    ids = torch.tensor([inputs.prompt_token_ids])
    fed.clear()
    hook = model.talker.thinker_to_talker_proj.register_forward_pre_hook(
        lambda module, args: fed.append(args[0][0].clone())
    )
    try:
        with torch.no_grad():
            model.talker(
                input_ids=ids,
                inputs_embeds=inputs.prompt_embeds[None].clone(),
                attention_mask=torch.ones_like(ids),
                input_text_ids=torch.tensor([prompt_ids + [SPEAKER_BOS["Chelsie"], output_ids[0]]]),
            )
    finally:
        hook.remove()
        model.talker.rope_deltas = None
    torch.testing.assert_close(intended.prompt_embeds, fed[0], rtol=0, atol=1e-12)


def test_talker_stage_writes_transformers_greedy_codes(model, ckpt):
    prompt_ids, output_ids, _, codes = reference_run(model, ckpt, max_codes=12)
    embeds, hidden = thinker_rows(model, prompt_ids, output_ids)
    specials = Qwen25TalkerSpecials.from_checkpoint(ckpt, torch.float64)
    inputs = qwen25_talker_inputs(
        embeds, hidden, prompt_ids, output_ids, specials, codec_rows=False
    )

    engine = talker_engine(ckpt)
    params = SamplingParams(
        temperature=0,
        repetition_penalty=1.05,
        max_tokens=len(codes),
        stop_token_ids=TALKER_EOS_IDS,
    )
    engine.add_tokenized_request(
        "talk", None, inputs.prompt_token_ids, params, inputs.prompt_embeds, True
    )
    engine.add_conditioning("talk", inputs.conditioning, True, inputs.fill)
    outputs = []
    while engine.has_unfinished_requests():
        outputs.extend(engine.step())
    assert outputs[-1].outputs[0].token_ids == codes
    assert max(codes) < CODEBOOK_SIZE  # codes the token2wav DiT knows


def test_audio_placeholders_reach_the_talker_as_hidden_states_only(model, ckpt):
    """With audio input, `generate` zeroes the (audio-feature) input embeddings at the
    `<|AUDIO|>` positions: the talker gets only the thinker's hidden state there."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ckpt)
    mel_frames = 100
    audio_tokens = ((mel_frames - 1) // 2 + 1 - 2) // 2 + 1  # the audio tower's output length
    text = (
        "<|im_start|>user\n<|audio_bos|>" + "<|AUDIO|>" * audio_tokens + "<|audio_eos|>Hi"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok(text, return_tensors="pt")["input_ids"]
    audio = dict(
        input_features=torch.randn(
            1, 128, mel_frames, generator=torch.Generator().manual_seed(0), dtype=torch.float64
        ),
        feature_attention_mask=torch.ones(1, mel_frames, dtype=torch.long),
    )
    fed: list[torch.Tensor] = []
    hook = model.talker.thinker_to_talker_proj.register_forward_pre_hook(
        lambda module, args: fed.append(args[0][0].clone())
    )
    model.token2wav.forward = lambda code, **kwargs: torch.zeros(1)  # not needed here
    try:
        seq, _ = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            **audio,
            thinker_max_new_tokens=6,
            talker_max_new_tokens=3,
            talker_do_sample=False,
            thinker_eos_token_id=IM_END_ID,
        )
    finally:
        hook.remove()
        del model.token2wav.forward
    prompt_ids, output_ids = ids[0].tolist(), seq[0, ids.shape[1] :].tolist()
    with torch.no_grad():
        states = model.thinker(
            input_ids=seq[:, :-1], **audio, output_hidden_states=True
        ).hidden_states
    specials = Qwen25TalkerSpecials.from_checkpoint(ckpt, torch.float64)
    inputs = qwen25_talker_inputs(
        states[0][0], states[-1][0], prompt_ids, output_ids, specials, codec_rows=False
    )
    is_audio = torch.tensor(prompt_ids) == model.config.thinker_config.audio_token_index
    assert int(is_audio.sum()) == audio_tokens
    torch.testing.assert_close(inputs.prompt_embeds, fed[0], rtol=0, atol=1e-10)
    torch.testing.assert_close(
        inputs.prompt_embeds[: len(prompt_ids)][is_audio],
        states[-1][0][: len(prompt_ids)][is_audio],
    )
