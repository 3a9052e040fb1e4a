"""CosyVoice3's causal HiFT vocoder (our port) against the reference `CausalHiFTGenerator`:
the RNG draws of construction (hence the fixed source noise), the waveform of a whole mel
and of the reference's own streaming check, the checkpoint forms `load_state_dict` takes,
and the checks on caller input and config.

The reference numbers are in `tests/fixtures/cosyvoice3/hift_tiny.pt`, written by hand by
`make_hift_fixture.py` in the reference's venv (a tiny config; see its docstring); nothing
here imports the reference.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from omnistage.families.cosyvoice3.hift import CosyVoice3HiFT, HiFTConfig

FIXTURE = Path(__file__).parents[1] / "fixtures" / "cosyvoice3" / "hift_tiny.pt"
# Same float32 torch ops as the reference (the F0 predictor in float64 as there): measured
# max |diff| 0.0 for the whole waveform and 6e-7 for streamed chunks (reference: its own
# streamed-vs-whole difference is 6e-7 too); the bound leaves room for other CPU kernels.
WAV_ATOL = 1e-5

# The `hift:` section of the released cosyvoice3.yaml, tags resolved.
RELEASED_HIFT = {
    "in_channels": 80,
    "base_channels": 512,
    "nb_harmonics": 8,
    "sampling_rate": 24000,
    "nsf_alpha": 0.1,
    "nsf_sigma": 0.003,
    "nsf_voiced_threshold": 10,
    "upsample_rates": [8, 5, 3],
    "upsample_kernel_sizes": [16, 11, 7],
    "istft_params": {"n_fft": 16, "hop_len": 4},
    "resblock_kernel_sizes": [3, 7, 11],
    "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
    "source_resblock_kernel_sizes": [7, 7, 11],
    "source_resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
    "lrelu_slope": 0.1,
    "audio_limit": 0.99,
    "conv_pre_look_right": 4,
    "f0_predictor": {"num_class": 1, "in_channels": 80, "cond_channels": 512},
}


@pytest.fixture(scope="module")
def reference() -> dict:
    return torch.load(FIXTURE)


@pytest.fixture(scope="module")
def built(reference) -> tuple[CosyVoice3HiFT, torch.Tensor, dict]:
    """Our vocoder built from the reference's RNG state, what the RNG gives next, and the
    initial weights' fingerprint (before any checkpoint is loaded)."""
    seconds = reference["kept_samples"] / reference["config"]["sampling_rate"]
    config = HiFTConfig.from_dict({**reference["config"], "max_seconds": seconds})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(reference["construction_seed"])
        model = CosyVoice3HiFT(config)
        rng_after = torch.rand(4)
    initial = {
        k: (float(v.double().abs().sum()), float(v.flatten()[0]))
        for k, v in model.state_dict().items()
    }
    return model, rng_after, initial


@pytest.fixture(scope="module")
def vocoder(built, reference) -> CosyVoice3HiFT:
    model = built[0]
    model.load_state_dict(reference["state_dict"])
    return model.eval()


def test_construction_draws_what_the_reference_draws(built, reference):
    model, rng_after, initial = built
    assert torch.equal(rng_after, reference["rng_after"])
    # Every default init at the same place in the sequence (the reference's weights pass
    # through weight norm, hence not bit-equal).
    assert initial.keys() == reference["weights_init"].keys()
    for name, (abs_sum, first) in reference["weights_init"].items():
        assert initial[name][0] == pytest.approx(abs_sum, rel=1e-5), name
        assert initial[name][1] == pytest.approx(first, abs=1e-6), name


def test_fixed_noise_is_the_references(built, reference):
    source, noise = built[0].m_source, reference["noise"]
    assert torch.equal(source.rand_ini, noise["rand_ini"])
    assert source.sine_noise.shape == (1, reference["kept_samples"], 9)
    assert torch.equal(source.sine_noise[0, :8], noise["sine_head"])
    assert torch.equal(source.sine_noise[0, -1], noise["sine_last_kept"])
    assert float(source.sine_noise.double().sum()) == pytest.approx(noise["sine_sum"], rel=1e-12)
    # Not weights: never saved or loaded.
    assert not any("noise" in k or "rand_ini" in k for k in built[0].state_dict())


def test_whole_mel_matches_the_reference(vocoder, reference):
    mel, expected = reference["mel"], reference["wav"]
    wav = vocoder.inference(mel, finalize=True)
    assert wav.shape == (1, vocoder.output_samples(mel.shape[2], True)) == expected.shape
    assert (wav - expected).abs().max().item() <= WAV_ATOL
    assert vocoder.f0_predictor.classifier.weight.dtype == torch.float64


def test_streamed_prefixes_match_the_references_chunks(vocoder, reference):
    mel, whole = reference["mel"], reference["wav"]
    ours_whole = vocoder.inference(mel, finalize=True)
    assert any(not c["finalize"] for c in reference["chunks"])
    for chunk in reference["chunks"]:
        frames, finalize, start = chunk["frames"], chunk["finalize"], chunk["start"]
        wav = vocoder.inference(mel[:, :, :frames], finalize=finalize)
        assert wav.shape[1] == vocoder.output_samples(frames, finalize)
        piece = wav[:, start:]
        expected = chunk.get("wav", whole[:, start:])
        assert piece.shape == expected.shape
        assert (piece - expected).abs().max().item() <= WAV_ATOL
        # What a streamed call emits is the whole utterance's (up to float rounding).
        assert (piece - ours_whole[:, start : start + piece.shape[1]]).abs().max() <= WAV_ATOL


def test_checkpoint_forms_load_to_the_same_weights(vocoder, reference):
    expected = {k: v.clone() for k, v in vocoder.state_dict().items()}
    old_style = {}
    for key, value in reference["state_dict"].items():
        key = key.replace("parametrizations.weight.original0", "weight_g")
        old_style["generator." + key.replace("parametrizations.weight.original1", "weight_v")] = (
            value
        )
    vocoder.load_state_dict(old_style)
    for key, value in vocoder.state_dict().items():
        assert torch.equal(value, expected[key]), key

    holder = nn.Module()  # loaded as a child of a bigger model, the hook still folds
    holder.hift = vocoder
    holder.load_state_dict({"hift." + k: v for k, v in reference["state_dict"].items()})
    for key, value in vocoder.state_dict().items():
        assert torch.equal(value, expected[key]), key
    vocoder.load_state_dict(expected)  # plain weights load as they are

    half = {k: v for k, v in reference["state_dict"].items() if not k.endswith("original0")}
    with pytest.raises(ValueError, match="conv_pre.weight"):
        vocoder.load_state_dict(half)
    with pytest.raises(RuntimeError, match="Unexpected"):
        vocoder.load_state_dict({**reference["state_dict"], "conv_pre.extra": torch.zeros(1)})


def test_caller_input_is_checked(vocoder, reference):
    mel = reference["mel"]
    for bad in (mel[0], mel.repeat(2, 1, 1), torch.zeros(1, 81, 20)):
        with pytest.raises(ValueError, match="mel: expected"):
            vocoder.inference(bad, finalize=True)
    with pytest.raises(ValueError, match="float"):
        vocoder.inference(mel.long(), finalize=True)
    with pytest.raises(ValueError, match="7 frames: finalize=False needs at least 8"):
        vocoder.inference(mel[:, :, :7], finalize=False)
    assert vocoder.inference(mel[:, :, :8], finalize=False).shape == (1, 0)
    # 1 s of noise kept: 50 frames fit it (53 streamed frames need 50 of source); longer
    # calls draw more (test_a_longer_excitation_draws_the_same_noise_again)
    long = torch.zeros(1, 80, 53)
    assert vocoder.inference(long[:, :, :50], finalize=True).shape == (1, 24000)
    assert vocoder.inference(long, finalize=False).shape == (1, 45 * 480)
    assert vocoder.m_source.max_samples == reference["kept_samples"]


def test_config_reads_the_released_section_and_names_bad_fields():
    config = HiFTConfig.from_dict(RELEASED_HIFT)
    assert config == HiFTConfig()
    assert config.samples_per_frame == 480
    assert config.stream_holdback_frames == 8
    assert config.output_samples(10, True) == 4800
    assert config.output_samples(10, False) == 960
    with pytest.raises(ValueError, match="HiFTConfig.generator_dim: unknown"):
        HiFTConfig.from_dict({"generator_dim": 3})
    with pytest.raises(ValueError, match="HiFTConfig.base_channels"):
        HiFTConfig.from_dict({"base_channels": "512"})
    with pytest.raises(ValueError, match="HiFTConfig.upsample_kernel_sizes"):
        HiFTConfig.from_dict({"upsample_kernel_sizes": [16, 11]})
    with pytest.raises(ValueError, match="HiFTConfig.resblock_kernel_sizes"):
        HiFTConfig(resblock_kernel_sizes=(4, 7, 11), resblock_dilation_sizes=((2,), (1,), (1,)))
    with pytest.raises(ValueError, match="HiFTConfig.istft_params"):
        HiFTConfig.from_dict({"istft_params": {"n_fft": 16, "win_len": 16}})
    with pytest.raises(ValueError, match="HiFTConfig.f0_predictor"):
        HiFTConfig.from_dict({"f0_predictor": {"num_class": 2}})
    with pytest.raises(ValueError, match="HiFTConfig.sampling_rate"):
        HiFTConfig(sampling_rate=22050)
    with pytest.raises(ValueError, match="HiFTConfig.max_seconds"):
        HiFTConfig(max_seconds=301)


def _built_keeping(reference: dict, seconds: float) -> CosyVoice3HiFT:
    config = HiFTConfig.from_dict({**reference["config"], "max_seconds": seconds})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(reference["construction_seed"])
        model = CosyVoice3HiFT(config)
    model.load_state_dict(reference["state_dict"])
    return model.eval()


def test_a_longer_excitation_draws_the_same_noise_again(reference):
    """Past the rows drawn at construction, the source draws a longer prefix of the same
    noise (what a source built with more seconds keeps), up to the reference's 300 s."""
    kept = reference["kept_samples"]
    rate = reference["config"]["sampling_rate"]
    vocoder, longer = (_built_keeping(reference, n * kept / rate) for n in (1, 3))
    source = vocoder.m_source
    rng = torch.get_rng_state()
    source.reserve_samples(kept + 1)
    assert torch.equal(torch.get_rng_state(), rng)  # the global RNG is left alone
    assert source.max_samples == 2 * kept  # at least doubled
    source.reserve_samples(3 * kept)
    assert source.max_samples == 4 * kept
    assert torch.equal(source.sine_noise[:, : 3 * kept], longer.m_source.sine_noise)
    assert torch.equal(source.sine_noise[0, :8], reference["noise"]["sine_head"])
    # 51 frames (24480 samples) past 1 s kept: the same waveform as a vocoder keeping 3 s
    mel = torch.randn(1, 80, 51, generator=torch.Generator().manual_seed(0))
    fresh = _built_keeping(reference, kept / rate)
    assert torch.equal(fresh.inference(mel, True), longer.inference(mel, True))
    assert fresh.m_source.max_samples == 2 * kept
    with pytest.raises(ValueError, match="covers 7200000 samples"):
        source.reserve_samples(300 * 24000 + 1)
