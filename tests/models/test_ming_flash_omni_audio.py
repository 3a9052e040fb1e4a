"""Ming-flash-omni-2.0's audio input (`ming_flash_omni/audio.py`, `input_encoder.py`) against
the reference, on the tiny checkpoint in float32, and the engine with audio prompts in
float64.

The fixture (`tests/fixtures/ming_flash_omni/audio_reference.npz`) was written by
`make_audio_fixture.py` beside it: openai-whisper 20250625's own `log_mel_spectrogram` and
`AudioEncoder` (the reference's `WhisperAudioEncoder` subclass), the projector built as the
reference builds it, and transcriptions of the reference's glue (this machine cannot reach
GitHub; the script's docstring says which), on the checkpoint `make_tiny_ming_flash_omni(path,
seed=0)` writes; the test rebuilds it and checks the digests of its thinker and audio shards.
Three cases: `<AUDIO>` at the start, no placeholder (the block and a newline appended), a
placeholder mid-sentence; clip lengths of 30, 61 and 25 feature frames.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
from safetensors.torch import load_file, save_file

from omnistage import SamplingParams
from omnistage.config import EngineConfig
from omnistage.core.multimodal_inputs import MultimodalDecoderInputs
from omnistage.engine.llm_engine import LLMEngine
from omnistage.families.ming_flash_omni.audio import MingFlashAudioEncoder, log_mel, sinusoids
from omnistage.families.ming_flash_omni.config import BailingMM2Config
from omnistage.families.ming_flash_omni.input_encoder import MingFlashInputEncoder
from omnistage.families.ming_flash_omni.tiny import make_tiny_ming_flash_omni
from omnistage.families.ming_flash_omni.tiny_audio import AUDIO_WEIGHTS, TINY_AUDIO
from omnistage.families.ming_omni.thinker import AUDIO
from tests.models.npz_fixture import checked_checkpoint, load_npz

FIXTURE = (
    Path(__file__).resolve().parents[1] / "fixtures" / "ming_flash_omni" / "audio_reference.npz"
)
CASES = [0, 1, 2]


@pytest.fixture(scope="module")
def fixture():
    return load_npz(FIXTURE)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, fixture):
    return checked_checkpoint(
        make_tiny_ming_flash_omni(tmp_path_factory.mktemp("ming-flash-audio"), seed=0), fixture
    )


@pytest.fixture(scope="module")
def encoder(ckpt):
    return MingFlashInputEncoder.from_checkpoint(ckpt, torch.float32)


@pytest.mark.parametrize("i", CASES)
def test_features_rows_prompt_and_routing_match_the_reference(encoder, fixture, i):
    prompt = json.loads(str(fixture["meta"]))["prompts"][i]
    wave = fixture[f"wave_{i}"]
    feats = encoder.audio_features(wave)
    reference = torch.from_numpy(fixture[f"feats_{i}"])
    assert feats.shape == reference.shape
    torch.testing.assert_close(feats, reference, rtol=0, atol=1e-6)  # measured 1.2e-7
    rows = torch.from_numpy(fixture[f"rows_{i}"])
    torch.testing.assert_close(encoder.audio(reference), rows, rtol=0, atol=1e-6)  # measured 0
    encoded = encoder.encode(prompt, [wave])
    ids = fixture[f"ids_{i}"].tolist()
    assert encoded.prompt_token_ids == ids
    loc, n = fixture[f"loc_len_{i}"].tolist()
    assert encoder.audio.num_tokens(feats.shape[0]) == n == rows.shape[0]
    audio = torch.from_numpy(fixture[f"mask_{i}"])
    assert audio.nonzero().flatten().tolist() == list(range(loc, loc + n))
    # The thinker's input: the rows at the placeholder run, the word embeddings elsewhere;
    # exactly that run routes through `audio_gate`.
    torch.testing.assert_close(encoded.prompt_embeds[audio], rows, rtol=0, atol=1e-5)
    words = encoder.embeddings[torch.tensor(ids)]
    assert torch.equal(encoded.prompt_embeds[~audio], words[~audio])
    assert torch.equal(encoded.token_modality, audio.to(torch.int64) * AUDIO)
    # ids in: the same expansion (the placeholder as the `<audio>` token)
    as_ids = encoder.tokenizer(prompt.replace("<AUDIO>", "<audio>")).input_ids
    assert encoder.encode(as_ids, [wave]).prompt_token_ids == ids


def test_the_encoder_has_the_reference_names_and_whispers_numerics(ckpt, encoder):
    names = set(load_file(ckpt / AUDIO_WEIGHTS))
    for name in (
        "audio.conv1.weight",
        "audio.conv2.bias",
        "audio.blocks.1.attn.query.bias",
        "audio.blocks.1.attn.key.weight",
        "audio.blocks.0.attn.out.weight",
        "audio.blocks.0.attn_ln.weight",
        "audio.blocks.0.mlp.2.bias",
        "audio.blocks.1.mlp_ln.bias",
        "audio.ln_post.weight",
        "linear_proj_audio.0.weight",  # the Conv1d
        "linear_proj_audio.3.bias",  # mlp_depth 2: Conv1d, Transpose, GELU, Linear
    ):
        assert name in names, name
    assert "audio.blocks.0.attn.key.bias" not in names
    assert set(encoder.audio.state_dict()) == names | {"audio.positional_embedding"}
    table = encoder.audio.audio.positional_embedding
    assert torch.equal(table, sinusoids(200, 32)) and table.shape == (200, 32)
    # conv2 halves, the projector (k 3, stride 2) halves again, rounding up
    assert [encoder.audio.num_tokens(t) for t in (1, 2, 3, 4, 5, 30, 98)] == [1, 1, 1, 1, 2, 8, 25]
    # features: one frame per 160 samples, and a 1 kHz tone's energy in the mel bins near it
    tone = np.sin(2 * np.pi * 1000 * np.arange(3200) / 16000).astype(np.float32)
    mel = log_mel(tone, 128)
    assert mel.shape == (20, 128)
    # Slaney mel: 1 kHz is mel 15 of 45.2 at 8 kHz; 130 edges -> filter 15 / (45.2 / 129) - 1
    assert abs(int(mel[10].argmax()) - 42) <= 1


def test_bad_audio_is_a_value_error_naming_the_field(encoder, ckpt, tmp_path):
    prompt = "<|im_start|>user\n<audio>Hi<|im_end|>\n"
    clip = np.zeros(1600, np.float32)
    with pytest.raises(ValueError, match="audio: 2 clips"):
        encoder.encode(prompt, [clip, clip])
    with pytest.raises(ValueError, match="audio: .*has no samples"):
        encoder.encode(prompt, [np.zeros(0, np.float32)])
    with pytest.raises(ValueError, match=r"audio: .*longer than the encoder's 4.0 s"):
        encoder.encode(prompt, [np.zeros(16000 * 5, np.float32)])
    with pytest.raises(ValueError, match="audio"):
        encoder.encode(prompt, [b"not a wav file at all"])
    with pytest.raises(ValueError, match=r"audio: the prompt has 2 <audio>"):
        encoder.encode(prompt + "<audio>", [clip])
    # A clip at another rate is resampled to 16 kHz (one frame per 10 ms either way).
    buffer = io.BytesIO()
    soundfile.write(buffer, np.zeros(2400, np.float32), 24000, format="WAV")
    assert encoder.audio_features(buffer.getvalue()).shape == (10, 128)
    # Checkpoint settings: ValueErrors naming the field.
    for field, value, says in (
        ("ds_stride", 3, "audio_config.ds_stride"),
        ("whisper_encoder_config", {"n_mels": 128}, "whisper_encoder_config.n_ctx"),
    ):
        with pytest.raises(ValueError, match=says):
            MingFlashAudioEncoder(dict(TINY_AUDIO, **{field: value}), 64, 2)
    weights = load_file(ckpt / AUDIO_WEIGHTS)
    del weights["audio.ln_post.bias"]
    bad = make_tiny_ming_flash_omni(tmp_path / "bad", seed=0)
    save_file(weights, bad / AUDIO_WEIGHTS)
    with pytest.raises(ValueError, match=r"audio\.ln_post\.bias.*missing"):
        MingFlashAudioEncoder.from_checkpoint(
            bad, BailingMM2Config.from_pretrained(bad), torch.float32
        )
    config = json.loads((bad / "config.json").read_text())
    config["audio_config"] = None
    (bad / "config.json").write_text(json.dumps(config))
    assert MingFlashInputEncoder.supported_modalities(BailingMM2Config(**config)) == {"image"}
    without = MingFlashInputEncoder.from_checkpoint(bad, torch.float32)
    with pytest.raises(ValueError, match="audio: this Ming-flash-omni checkpoint has no audio"):
        without.encode(prompt, [clip])


def _clip(seconds: float, hz: float) -> np.ndarray:
    t = np.arange(int(seconds * 16000)) / 16000
    return (0.4 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def _engine(ckpt, **kw) -> LLMEngine:
    config = EngineConfig(model=str(ckpt), model_part="thinker", dtype="float64", **kw)
    return LLMEngine(config)


def _run(engine: LLMEngine, requests: list, routed: bool = True) -> dict[str, list[int]]:
    for rid, (encoded, seed) in requests:
        params = SamplingParams(temperature=0.9, seed=seed, max_tokens=6)
        mm = MultimodalDecoderInputs.from_encoded_prompt(encoded) if routed else None
        engine.add_tokenized_request(
            rid, None, encoded.prompt_token_ids, params, encoded.prompt_embeds, mm_decoder_inputs=mm
        )
    out: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                out[o.request_id] = o.outputs[0].token_ids
    return out


def test_float64_audio_prompts_sync_equals_async_and_alone_equals_batched(tmp_path_factory):
    ckpt = make_tiny_ming_flash_omni(tmp_path_factory.mktemp("f64"), dtype=torch.float64)
    enc = MingFlashInputEncoder.from_checkpoint(ckpt, torch.float64)
    prompts = [
        ("<|im_start|>user\n<audio>What is it?<|im_end|>\n<|im_start|>assistant\n", 0.4, 300),
        ("<|im_start|>user\nListen<|im_end|>\n<|im_start|>assistant\n", 0.9, 700),
        ("<|im_start|>user\nOne <audio> two<|im_end|>\n<|im_start|>assistant\n", 0.25, 1200),
    ]
    requests = [
        (f"r{k}", (enc.encode(text, [_clip(s, hz)]), 10 + k))
        for k, (text, s, hz) in enumerate(prompts)
    ]
    chunked = dict(max_num_batched_tokens=24, executor_backend="inline")
    sync = _run(_engine(ckpt, async_scheduling=False, **chunked), requests)
    asynchronous = _run(_engine(ckpt, async_scheduling=True, executor_backend="thread"), requests)
    assert sync == asynchronous and all(len(v) == 6 for v in sync.values())
    for request in requests:
        assert _run(_engine(ckpt, executor_backend="inline"), [request]) == {
            request[0]: sync[request[0]]
        }
    # The codes reach the engine: the same rows all through `gate` sample other ids.
    unrouted = _run(_engine(ckpt, executor_backend="inline"), requests, routed=False)
    assert unrouted != sync
    # The audio rows are read: another clip in the same prompt changes the sampled ids.
    other = [("r0", (enc.encode(prompts[0][0], [_clip(0.4, 2500)]), 10))]
    assert _run(_engine(ckpt, executor_backend="inline"), other)["r0"] != sync["r0"]


def test_an_image_and_a_clip_in_one_prompt_route_through_their_gates(encoder):
    from omnistage.families.ming_flash_omni.rope import image_positions
    from omnistage.families.ming_omni.thinker import IMAGE

    image = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    prompt = "<|im_start|>user\n<image>Look, and listen: <AUDIO><|im_end|>\n"
    encoded = encoder.encode(prompt, [_clip(0.3, 500)], [image])
    ids = torch.tensor(encoded.prompt_token_ids)
    kinds = encoded.token_modality
    assert torch.equal(kinds == IMAGE, ids == encoder.ids["<imagePatch>"])
    assert torch.equal(kinds == AUDIO, ids == encoder.ids["<audioPatch>"])
    assert int((kinds == AUDIO).sum()) == encoder.audio.num_tokens(30) and (kinds == IMAGE).any()
    # Audio positions are text positions of the 3-D rotary (the image's rope index).
    expected, delta = image_positions(
        encoded.prompt_token_ids, encoder.ids["<imagePatch>"], encoded.image_grid_thw, 2
    )
    assert torch.equal(encoded.mrope_positions, expected) and encoded.rope_delta == delta
    heard = encoded.mrope_positions[:, kinds == AUDIO]
    assert torch.equal(heard[0], heard[1]) and torch.equal(heard[0], heard[2])
    assert torch.equal(heard[0].diff(), torch.ones(heard.shape[1] - 1, dtype=heard.dtype))
