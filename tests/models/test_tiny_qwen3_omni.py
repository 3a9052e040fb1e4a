"""The tiny Qwen3-Omni checkpoint (`omnistage.families.qwen3_omni.tiny`) against transformers.

It loads as `Qwen3OmniMoeForConditionalGeneration`, and the reference
`generate` writes text and audio from a text-only chat, deterministically.

What makes transformers' `generate` deterministic (transformers 5.23):

- thinker: greedy. Its sampling settings come from `model.thinker.generation_config`
  (built from `thinker_config`; `generation_config.json` of the checkpoint is only
  read into the top-level model's config), which is greedy unless `thinker_do_sample=True`
  (or a bare `do_sample=True`, which goes to the thinker) is passed.
- talker: `generate(..., talker_do_sample=False)`. The talker samples by default
  (`talker_do_sample=True`, top_k=50, top_p=1.0, temperature=0.9); with
  `do_sample=False` its first codebook is argmax *after* a repetition penalty of
  1.05 over its own previously generated codes and after suppressing the top 1024
  ids of its vocabulary except `codec_eos` — both still deterministic.
  `_prepare_generation_config` mirrors `do_sample` onto the code predictor, which
  then takes the argmax for the remaining codebooks too.
- sampled runs draw from torch's global RNG (thinker, talker and code predictor in
  one stream); `torch.manual_seed(s)` before `generate` reproduces them.
- float64 needs `experts_implementation="eager"`: the default MoE kernel
  (`grouped_mm`, `torch._grouped_mm`) accepts only float32 / bfloat16 / float16.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors import safe_open
from transformers import AutoFeatureExtractor, AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

from omnistage.families.qwen3_omni.tiny import make_tiny_qwen3_omni
from omnistage.families.qwen3_omni.tiny_config import (
    ACCEPT_HIDDEN_LAYER,
    CODEBOOK_SIZE,
    CODEC_IDS,
    NUM_CODE_GROUPS,
    SPEAKER_IDS,
    TALKER_VOCAB_SIZE,
)
from omnistage.families.qwen3_omni.tiny_processor import IM_END_ID, THINKER_VOCAB_SIZE

SAMPLES_PER_FRAME = 64  # product of code2wav upsampling_ratios and upsample_rates
SAMPLES_DROPPED_PER_DECODE = 30  # trailing samples the causal transposed convs never emit
# `generate` defaults `thinker_eos_token_id` to 151645, the real model's <|im_end|>.
GREEDY = dict(thinker_do_sample=False, talker_do_sample=False, thinker_eos_token_id=IM_END_ID)
CHAT = [
    {"role": "system", "content": "You are a tiny test model."},
    {"role": "user", "content": "Say something."},
]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_qwen3_omni(tmp_path_factory.mktemp("tiny-qwen3-omni"))


@pytest.fixture(scope="module")
def model(ckpt):
    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        ckpt, dtype=torch.float64, experts_implementation="eager"
    )


@pytest.fixture(scope="module")
def tok(ckpt):
    return AutoTokenizer.from_pretrained(ckpt)


def _chat_inputs(tok, messages=CHAT):
    return tok.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )


def test_checkpoint_layout_and_ids(ckpt, tok):
    config = json.loads((ckpt / "config.json").read_text())
    assert config["architectures"] == ["Qwen3OmniMoeForConditionalGeneration"]
    assert {"thinker_config", "talker_config", "code2wav_config"} <= config.keys()
    with safe_open(ckpt / "model.safetensors", "pt") as f:
        names = set(f.keys())
    assert {n.split(".")[0] for n in names} == {"thinker", "talker", "code2wav"}
    # The Hub layout: experts stored one by one (transformers fuses them on load).
    assert "thinker.model.layers.1.mlp.experts.3.gate_proj.weight" in names
    assert "talker.model.layers.0.mlp.experts.0.down_proj.weight" in names
    assert "talker.model.layers.0.mlp.shared_expert_gate.weight" in names
    assert not any("gate_up_proj" in n for n in names)
    assert "thinker.lm_head.weight" in names and "thinker.audio_tower.conv2d1.weight" in names
    assert "talker.code_predictor.lm_head.2.weight" in names  # num_code_groups - 1 heads

    thinker, talker = config["thinker_config"], config["talker_config"]
    ids = tok.convert_tokens_to_ids
    assert config["im_start_token_id"] == ids("<|im_start|>") == 1
    assert config["im_end_token_id"] == ids("<|im_end|>") == tok.eos_token_id
    assert config["tts_pad_token_id"] == ids("<tts_pad>")
    assert config["tts_bos_token_id"] == ids("<tts_text_bos>")
    assert config["tts_eos_token_id"] == ids("<tts_text_eod>")
    newline = tok("\n")["input_ids"]
    assert len(newline) == 1
    for role in ("system", "user", "assistant"):
        assert config[f"{role}_token_id"] == ids(role)
        # `<|im_start|>` is followed by exactly one role token, as generate() assumes.
        assert tok(f"<|im_start|>{role}\n")["input_ids"] == [1, ids(role), *newline]
    for cfg in (thinker, talker):
        assert cfg["audio_token_id"] == ids("<|audio_pad|>") == tok.audio_token_id
        assert cfg["image_token_id"] == ids("<|image_pad|>") == tok.image_token_id
        assert cfg["video_token_id"] == ids("<|video_pad|>") == tok.video_token_id
        assert cfg["audio_start_token_id"] == ids("<|audio_start|>")
        assert cfg["vision_start_token_id"] == ids("<|vision_start|>")
    assert len(tok) <= thinker["text_config"]["vocab_size"] == THINKER_VOCAB_SIZE

    assert talker["text_config"]["vocab_size"] == TALKER_VOCAB_SIZE == CODEBOOK_SIZE + 1024
    for key, value in {**CODEC_IDS, **SPEAKER_IDS}.items():
        assert CODEBOOK_SIZE <= value < TALKER_VOCAB_SIZE, key
    assert talker["speaker_id"] == SPEAKER_IDS
    assert talker["code_predictor_config"]["vocab_size"] == CODEBOOK_SIZE
    assert config["code2wav_config"]["codebook_size"] == CODEBOOK_SIZE
    assert talker["num_code_groups"] == NUM_CODE_GROUPS
    assert talker["code_predictor_config"]["num_code_groups"] == NUM_CODE_GROUPS
    assert config["code2wav_config"]["num_quantizers"] == NUM_CODE_GROUPS
    assert talker["accept_hidden_layer"] == ACCEPT_HIDDEN_LAYER
    assert talker["thinker_hidden_size"] == thinker["text_config"]["hidden_size"]


def test_same_seed_same_files(ckpt, tmp_path):
    again = make_tiny_qwen3_omni(tmp_path / "again")
    assert (again / "model.safetensors").read_bytes() == (ckpt / "model.safetensors").read_bytes()


def test_loads_in_float64(model):
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    assert model.has_talker
    assert int(model.code2wav.total_upsample) == SAMPLES_PER_FRAME


def test_generate_text_and_audio_is_deterministic(model, tok, monkeypatch):
    codes = []
    decode = model.code2wav.chunked_decode

    def recording_decode(talker_codes, **kwargs):
        codes.append(talker_codes.clone())
        return decode(talker_codes, **kwargs)

    monkeypatch.setattr(model.code2wav, "chunked_decode", recording_decode)
    inputs = _chat_inputs(tok)
    prompt_len = inputs["input_ids"].shape[1]
    kwargs = dict(thinker_max_new_tokens=6, talker_max_new_tokens=8, **GREEDY)
    seq1, wav1 = model.generate(**inputs, **kwargs)
    seq2, wav2 = model.generate(**inputs, **kwargs)
    assert torch.equal(seq1, seq2)
    assert torch.equal(wav1, wav2)
    assert torch.equal(codes[0], codes[1])
    # [batch, codebooks, frames]; the first codebook (the talker's own tokens) varies.
    assert codes[0].shape == (1, NUM_CODE_GROUPS, 8 - 1)
    assert len(set(codes[0][0, 0].tolist())) > 1
    assert int(codes[0].max()) < CODEBOOK_SIZE

    generated = seq1[0, prompt_len:].tolist()
    assert 0 < len(generated) <= 6
    assert all(3 <= t < 259 or t == tok.eos_token_id for t in generated)  # bytes or <|im_end|>
    assert isinstance(tok.decode(generated, skip_special_tokens=True), str)

    # The talker never emits codec_eos, so it writes talker_max_new_tokens - 1 frames
    # (the last sampled first-codebook token gets no residual codes).
    frames = 8 - 1
    assert wav1.shape == (1, 1, frames * SAMPLES_PER_FRAME - SAMPLES_DROPPED_PER_DECODE)
    assert wav1.dtype == torch.float32
    assert torch.isfinite(wav1).all() and wav1.abs().max() <= 1.0
    assert (wav1.abs() < 1.0).float().mean() > 0.9  # mostly inside the clamp
    assert wav1.std() > 1e-3

    # Text-only generation gives the same thinker tokens.
    text_only = model.generate(**inputs, return_audio=False, thinker_max_new_tokens=6, **GREEDY)
    assert torch.equal(text_only, seq1)


def test_sampled_talker_is_reproducible_with_a_seed(model, tok):
    inputs = _chat_inputs(tok)
    kwargs = dict(
        thinker_max_new_tokens=3,
        talker_max_new_tokens=5,
        talker_do_sample=True,
        thinker_eos_token_id=IM_END_ID,
    )
    runs = []
    for _ in range(2):
        torch.manual_seed(1234)
        runs.append(model.generate(**inputs, **kwargs))
    assert torch.equal(runs[0][0], runs[1][0])
    assert torch.equal(runs[0][1], runs[1][1])


def test_code2wav_is_causal_and_chunked_decode_needs_enough_context(model):
    code2wav = model.code2wav
    codes = torch.randint(
        0, CODEBOOK_SIZE, (1, NUM_CODE_GROUPS, 24), generator=torch.Generator().manual_seed(0)
    )
    full = code2wav(codes)
    assert full.shape[-1] == 24 * SAMPLES_PER_FRAME - SAMPLES_DROPPED_PER_DECODE
    # Causal: a prefix of the codes decodes to a prefix of the waveform.
    head = code2wav(codes[..., :9])
    torch.testing.assert_close(head, full[..., : head.shape[-1]], rtol=0, atol=1e-10)
    # chunked_decode: chunk k yields full[start * 64 : end * 64 - 30] when its left context
    # covers the receptive field (then the 30 samples at each chunk end are simply missing).
    chunked = code2wav.chunked_decode(codes, chunk_size=8, left_context_size=24)
    per_chunk = 8 * SAMPLES_PER_FRAME - SAMPLES_DROPPED_PER_DECODE
    assert chunked.shape[-1] == 3 * per_chunk
    for k in range(3):
        start = k * 8 * SAMPLES_PER_FRAME
        torch.testing.assert_close(
            chunked[..., k * per_chunk : (k + 1) * per_chunk],
            full[..., start : start + per_chunk],
            rtol=0,
            atol=1e-10,
        )
    # With a short left context (the real default is 25 frames for a 72-frame attention
    # window), later chunks differ from the full decode.
    short = code2wav.chunked_decode(codes, chunk_size=8, left_context_size=2)
    assert not torch.allclose(short[..., per_chunk:], chunked[..., per_chunk:])


def _audio_and_image():
    rs = np.random.RandomState(0)
    audio = (0.1 * rs.randn(16000)).astype(np.float32)  # 1 s at 16 kHz
    image = rs.randint(0, 255, (64, 64, 3), dtype=np.uint8)  # 4x4 patches of 16 -> 4 tokens
    return audio, image


def _multimodal_chat(audio, image):
    return [
        {
            "role": "user",
            "content": [
                {"type": "audio", "audio": audio},
                {"type": "image", "image": image},
                {"type": "text", "text": "What is this?"},
            ],
        }
    ]


def test_tokenizer_and_feature_extractor_offline_feed_the_thinker(ckpt, tok, model):
    """The parts of the processor that need neither Pillow nor torchvision, by hand."""
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import (
        _get_feat_extract_output_lengths,
    )

    audio, _ = _audio_and_image()
    fe = AutoFeatureExtractor.from_pretrained(ckpt)
    assert type(fe).__name__ == "WhisperFeatureExtractor" and fe.feature_size == 128
    feats = fe(
        [audio], sampling_rate=16000, padding=True, return_attention_mask=True, return_tensors="pt"
    )
    assert feats["input_features"].shape == (1, 128, 100)  # 10 ms hop
    n_audio = int(_get_feat_extract_output_lengths(feats["attention_mask"].sum(-1), 50)[0])
    assert n_audio == 13

    prompt = tok.apply_chat_template(
        _multimodal_chat(audio, None), add_generation_prompt=True, tokenize=False
    )
    assert (
        "<|audio_start|><|audio_pad|><|audio_end|><|vision_start|><|image_pad|><|vision_end|>"
        in prompt
    )
    prompt = prompt.replace("<|audio_pad|>", "<|audio_pad|>" * n_audio)
    prompt = prompt.replace("<|image_pad|>", "<|image_pad|>" * 4)
    enc = tok(prompt, return_tensors="pt")
    # What Qwen2VLImageProcessor would give for a 64x64 image: 16 patches of 3*2*16*16 values.
    pixel_values = torch.randn(16, 3 * 2 * 16 * 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model.thinker(
            **enc,
            input_features=feats["input_features"].double(),
            feature_attention_mask=feats["attention_mask"],
            pixel_values=pixel_values.double(),
            image_grid_thw=torch.tensor([[1, 4, 4]]),
        )
    assert out.logits.shape == (1, enc["input_ids"].shape[1], THINKER_VOCAB_SIZE)
    assert torch.isfinite(out.logits).all()


def test_processor_chat_with_audio_and_image(ckpt, model):
    # Qwen2VLImageProcessor needs Pillow or torchvision; Qwen2VLVideoProcessor needs
    # torchvision, and the processor cannot be built without its video processor.
    pytest.importorskip("PIL")
    pytest.importorskip("torchvision")
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(ckpt)
    assert type(processor).__name__ == "Qwen3OmniMoeProcessor"
    audio, image = _audio_and_image()
    inputs = processor.apply_chat_template(
        _multimodal_chat(audio, image),
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
    )
    ids = inputs["input_ids"][0].tolist()
    assert ids.count(processor.audio_token_id) == 13
    assert ids.count(processor.image_token_id) == 4
    assert inputs["image_grid_thw"].tolist() == [[1, 4, 4]]
    with torch.no_grad():
        out = model.thinker(
            **{k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}
        )
    assert torch.isfinite(out.logits).all()
