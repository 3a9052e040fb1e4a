"""EMOVA's unit-to-speech decoder (Dynin-Omni's token2audio) against the reference: UVITS's
`synthesis_from_content_unit_style_embedding` on the tiny checkpoint's `vq_model_audio`
weights (tests/fixtures/dynin_omni/u2s_reference.npz, made by make_u2s_fixture.py).

float32, same seeds: the same number of samples (the sampled durations agree) and the same
waveform within 1e-5 (bit-identical when the fixture was made: 0.0 measured), for four
unit sequences over three styles, one of a single unit. float64 stays within 1e-5 of it.
Bad checkpoints and styles are refused by name.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from omnistage.families.dynin_omni.emova_u2s import VQ_AUDIO_DIR, U2SConfig, load_emova_u2s
from omnistage.families.dynin_omni.tiny import TINY_STYLES, make_tiny_dynin_omni

FIXTURE = Path(__file__).parents[1] / "fixtures/dynin_omni/u2s_reference.npz"
N_UNITS = 32


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_dynin_omni(tmp_path_factory.mktemp("dynin_u2s") / "tiny", seed=0)


def cases():
    ref = np.load(FIXTURE)
    for i in range(len([k for k in ref.files if k.startswith("wave_")])):
        style, seed = (int(v) for v in ref[f"case_{i}"])
        yield torch.from_numpy(ref[f"units_{i}"]), style, seed, ref[f"wave_{i}"]


def synth(model, units, style, seed) -> np.ndarray:
    with torch.inference_mode():
        wave = model.synthesize(units, style, torch.Generator().manual_seed(seed))
    return wave.double().numpy()


def test_waveforms_equal_the_reference_decoder_float32(checkpoint):
    model = load_emova_u2s(checkpoint, N_UNITS, torch.float32)
    seen = 0
    for units, style, seed, expected in cases():
        got = synth(model, units, style, seed)
        assert got.shape == expected.shape, (units.tolist(), style, seed)
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
        seen += 1
    assert seen == 4


def test_float64_stays_near_float32_and_seeds_and_styles_matter(checkpoint):
    model = load_emova_u2s(checkpoint, N_UNITS, torch.float64)
    units, style, seed, expected = next(cases())
    got = synth(model, units, style, seed)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
    assert not np.array_equal(synth(model, units, style, seed + 1), got)
    other = synth(model, units, (style + 1) % len(TINY_STYLES), seed)
    assert other.shape != got.shape or not np.allclose(other, got)


def test_styles_and_bad_checkpoints_are_named(checkpoint, tmp_path):
    model = load_emova_u2s(checkpoint, N_UNITS, torch.float32)
    assert model.style_index(None) == TINY_STYLES.index(
        "gender-female_emotion-neutral_speed-normal_pitch-normal"
    )
    with pytest.raises(ValueError, match="speaker: 'nobody'"):
        model.style_index("nobody")
    raw = json.loads((checkpoint / VQ_AUDIO_DIR / "config.json").read_text())
    with pytest.raises(ValueError, match="use_sdp"):
        U2SConfig.from_dict(
            {
                **raw,
                "u2s_config": {
                    **raw["u2s_config"],
                    "model": {**raw["u2s_config"]["model"], "use_sdp": False},
                },
            }
        )
    with pytest.raises(ValueError, match="u2s_config"):
        U2SConfig.from_dict({k: v for k, v in raw.items() if k != "u2s_config"})
    with pytest.raises(ValueError, match="num_symbols"):
        load_emova_u2s(checkpoint, 10_000, torch.float32)
    with pytest.raises(ValueError, match="vq_model_audio"):
        load_emova_u2s(tmp_path, N_UNITS, torch.float32)
