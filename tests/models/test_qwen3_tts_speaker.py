"""Qwen3-TTS voice-clone inputs against the official qwen-tts 0.1.1: the log-mel front end and
the x-vector of a tiny seeded speaker encoder, the speech tokenizer encoder's codes, and the
checks on `ref_audio`.

The reference numbers are in `tests/fixtures/qwen3_tts/speaker_encoder.npz`, written by hand
by `make_speaker_fixture.py` in the reference's own venv; nothing here imports qwen-tts.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
from safetensors.torch import save_file

from omnistage.families.qwen3_tts.reference_codes import ReferenceAudioEncoder
from omnistage.families.qwen3_tts.speaker_encoder import (
    MEL_PARAMS,
    SpeakerEncoder,
    mel_filterbank,
    mel_spectrogram,
)
from omnistage.families.qwen3_tts.tiny_speaker import (
    random_speaker_encoder_state,
    tiny_speaker_encoder_config,
)
from omnistage.voice_store import SAMPLE_RATE, load_reference_audio

FIXTURE = Path(__file__).parents[1] / "fixtures" / "qwen3_tts" / "speaker_encoder.npz"
# Same torch ops as the reference's, in float32: measured max |diff| 0.0 for the mel and the
# embedding (and an exact filterbank); the bounds leave room for other BLAS/CPU kernels.
MEL_ATOL = 1e-4
EMBED_ATOL = 1e-4


def _signal(seed: int, seconds: float, f0: float, f1: float, amp: float, noise: float):
    # The fixture script's `test_signal` recipe (checked against its checksum below).
    t = np.arange(int(round(seconds * 24000))) / 24000.0
    phase = 2 * np.pi * (f0 * t + (f1 - f0) * t**2 / (2 * seconds))
    rng = np.random.default_rng(seed)
    return (amp * np.sin(phase) + noise * rng.standard_normal(t.size)).astype(np.float32)


@pytest.fixture(scope="module")
def fixture() -> dict[str, np.ndarray]:
    with np.load(FIXTURE) as data:
        return {k: data[k] for k in data.files}


@pytest.fixture(scope="module")
def signal(fixture) -> np.ndarray:
    samples = _signal(**json.loads(str(fixture["signal_recipe"])))
    np.testing.assert_array_equal(samples[:8], fixture["signal_head"])
    assert samples.astype(np.float64).sum() == pytest.approx(float(fixture["signal_sum"]), abs=1e-9)
    return samples


def test_filterbank_equals_librosa(fixture):
    ours = mel_filterbank(24000, 1024, 128, 0.0, 12000.0)
    assert ours.shape == tuple(fixture["filterbank_shape"])
    flat = ours.reshape(-1)
    np.testing.assert_array_equal(np.flatnonzero(flat), fixture["filterbank_index"])
    np.testing.assert_allclose(
        flat[fixture["filterbank_index"]], fixture["filterbank_value"], rtol=1e-6
    )


def test_mel_matches_reference(fixture, signal):
    mel = mel_spectrogram(torch.from_numpy(signal).unsqueeze(0))[0].numpy()
    assert mel.shape == fixture["mel"].shape
    np.testing.assert_allclose(mel, fixture["mel"], rtol=0, atol=MEL_ATOL)
    assert MEL_PARAMS["num_mels"] == 128


def test_speaker_embedding_matches_reference(fixture, signal, tmp_path):
    config = tiny_speaker_encoder_config()
    assert config == json.loads(str(fixture["speaker_config"]))
    state = random_speaker_encoder_state(config, int(fixture["speaker_seed"]))
    state["talker.unrelated.weight"] = torch.zeros(2)  # other parts of the checkpoint
    save_file(state, str(tmp_path / "model.safetensors"))
    encoder = SpeakerEncoder.from_checkpoint(tmp_path, config, torch.float32)
    embedding = encoder.embed(signal)
    assert embedding.shape == (32,)
    np.testing.assert_allclose(embedding.numpy(), fixture["embedding"], rtol=0, atol=EMBED_ATOL)


def test_speaker_encoder_rejects_mismatched_weights(tmp_path):
    config = tiny_speaker_encoder_config()
    state = random_speaker_encoder_state(config, 0)
    state.pop("speaker_encoder.fc.bias")
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="fc.bias"):
        SpeakerEncoder.from_checkpoint(tmp_path, config)


def _tokenizer_checkpoint(fixture, root: Path) -> Path:
    folder = root / "speech_tokenizer"
    folder.mkdir()
    (folder / "config.json").write_text(str(fixture["tokenizer_config"]), encoding="utf-8")
    state = {
        k[len("mimi/") :]: torch.from_numpy(v) for k, v in fixture.items() if k.startswith("mimi/")
    }
    state["decoder.unrelated.weight"] = torch.zeros(2)  # the decoder half is not loaded
    save_file(state, str(folder / "model.safetensors"))
    return root


def test_reference_codes_match_reference(fixture, signal, tmp_path):
    encoder = ReferenceAudioEncoder.from_checkpoint(_tokenizer_checkpoint(fixture, tmp_path))
    codes = encoder.encode(signal)
    assert codes.dtype == torch.int64
    np.testing.assert_array_equal(codes.numpy(), fixture["codes"])
    prefix = encoder.encode(signal[: int(fixture["prefix_samples"])])
    np.testing.assert_array_equal(prefix.numpy(), fixture["codes_prefix"])
    assert len(np.unique(fixture["codes"])) > 3  # the fixture is not degenerate


def _wav_bytes(samples: np.ndarray, rate: int) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="WAV", subtype="FLOAT")
    return buffer.getvalue()


def test_load_reference_audio_resamples_and_downmixes(signal):
    stereo = np.stack([signal, signal], axis=1)
    clip = load_reference_audio(_wav_bytes(stereo[::3], 8000))
    assert clip.dtype == np.float32 and clip.ndim == 1
    assert abs(clip.size - signal.size) <= 3
    same = load_reference_audio(signal, SAMPLE_RATE)
    np.testing.assert_array_equal(same, signal)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda s: _wav_bytes(s[:12000], SAMPLE_RATE), "lasts 0.50 s"),
        (lambda s: _wav_bytes(np.tile(s, 16), SAMPLE_RATE), "lasts 32.00 s"),
        (lambda s: _wav_bytes(np.zeros_like(s), SAMPLE_RATE), "silent"),
        (lambda s: b"RIFF not really a wav file", "cannot decode"),
        (lambda s: b"", "empty"),
    ],
)
def test_load_reference_audio_errors_name_the_field(signal, make, message):
    with pytest.raises(ValueError, match=message) as info:
        load_reference_audio(make(signal))
    assert str(info.value).startswith("ref_audio: ")


def test_load_reference_audio_rejects_bad_arrays(signal):
    bad = signal.copy()
    bad[100] = np.nan
    for data, rate in ((bad, SAMPLE_RATE), (signal, None), (signal, -1)):
        with pytest.raises(ValueError, match="^ref_audio: "):
            load_reference_audio(data, rate)
    with pytest.raises(ValueError, match="^ref_audio: "):
        load_reference_audio(_wav_bytes(signal, SAMPLE_RATE), SAMPLE_RATE)
