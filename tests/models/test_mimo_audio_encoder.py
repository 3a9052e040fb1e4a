"""The MiMo-Audio tokenizer's encoder (`audio_encoder.py`) on the tiny checkpoint: its
codes equal the official `AudioEncoder.encode`'s (`fixtures/mimo_audio/encoder.json`,
made by `make_reference_fixture.py`) for a two-segment clip (the reference's batch pads
the shorter segment's odd tail with itself) and a one-segment clip (zeros); the log-mel
front end equals transformers' independent implementation of the same definition."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from omnistage.families.mimo_audio.audio_encoder import load_audio_encoder, wav2mel
from omnistage.families.mimo_audio.tiny import CLIP_SAMPLES, make_tiny_mimo_audio, tiny_clip

FIXTURE = Path(__file__).parents[1] / "fixtures" / "mimo_audio" / "encoder.json"


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory) -> Path:
    seed = json.loads(FIXTURE.read_text())["seed"]
    return make_tiny_mimo_audio(tmp_path_factory.mktemp("mimo") / "lm", seed) / "audio_tokenizer"


def test_codes_equal_the_reference(tokenizer_folder) -> None:
    encoder = load_audio_encoder(tokenizer_folder)
    clips = json.loads(FIXTURE.read_text())["clips"]
    assert [c["samples"] for c in clips] == list(CLIP_SAMPLES)
    for clip in clips:
        mel = wav2mel(tiny_clip(clip["samples"]), encoder.config)
        assert mel.shape[0] == clip["mel_frames"]
        codes = encoder.encode(mel)
        assert codes.tolist() == clip["codes"]
        assert len({tuple(r) for r in clip["codes"]}) > 1  # not a constant code


@pytest.mark.filterwarnings("ignore:At least one mel filter has all zero values")
def test_log_mel_equals_transformers(tokenizer_folder) -> None:
    from transformers.audio_utils import mel_filter_bank, spectrogram, window_function

    c = load_audio_encoder(tokenizer_folder).config
    wav = tiny_clip(400)
    filters = mel_filter_bank(
        num_frequency_bins=c.nfft // 2 + 1, num_mel_filters=c.n_mels, min_frequency=c.fmin,
        max_frequency=c.sampling_rate / 2, sampling_rate=c.sampling_rate, norm=None,
        mel_scale="htk",
    )  # fmt: skip
    expected = spectrogram(
        wav.double().numpy(), window_function(c.window_size, "hann", frame_length=c.nfft),
        frame_length=c.nfft, hop_length=c.hop_length, power=1.0, center=True,
        pad_mode="reflect", mel_filters=filters, mel_floor=1e-7, log_mel="log",
    )  # fmt: skip
    np.testing.assert_allclose(wav2mel(wav, c).T.numpy(), expected, rtol=1e-4, atol=1e-5)


def test_a_missing_tokenizer_is_named(tmp_path) -> None:
    with pytest.raises(ValueError, match="config.json is missing"):
        load_audio_encoder(tmp_path)
