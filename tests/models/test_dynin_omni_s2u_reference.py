"""EMOVA's speech-to-unit encoder (S2U) against its reference: `s2u_reference.npz`, made by
tests/fixtures/dynin_omni/make_s2u_fixture.py with EMOVA's vendored NeMo code on the tiny
checkpoint's `s2u/` weights. Features and encodings within 1e-5, units identical; the real
S2U run's hyper-parameters (`emova_s2u_hparams.yaml`, an excerpt of EMOVA's) give EMOVA's
sizes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from omnistage.families.dynin_omni.s2u import S2U_DIR, S2UConfig, SpeechToUnit
from omnistage.families.dynin_omni.tiny_s2u import TINY_S2U_LEVELS, make_tiny_s2u

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures/dynin_omni"
CASES = range(4)


@pytest.fixture(scope="module")
def ref() -> dict[str, np.ndarray]:
    return dict(np.load(FIXTURES / "s2u_reference.npz"))


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # make_tiny_dynin_omni(seed=0) draws the S2U from its own generator, seed 0 + 7919.
    path = tmp_path_factory.mktemp("s2u") / S2U_DIR
    make_tiny_s2u(path, TINY_S2U_LEVELS, torch.Generator().manual_seed(7919))
    return path


@pytest.fixture(scope="module")
def model(folder: Path) -> SpeechToUnit:
    return SpeechToUnit.load(folder)


def test_mel_banks_are_librosas(model: SpeechToUnit, ref: dict) -> None:
    assert np.abs(model.frontend.banks.numpy() - ref["fb"]).max() < 1e-8


@pytest.mark.parametrize("case", CASES)
def test_features_encodings_and_units_match_reference(
    model: SpeechToUnit, ref: dict, case: int
) -> None:
    wav = torch.from_numpy(ref[f"wav_{case}"])
    feats, length = model.frontend(wav)
    assert length == int(ref[f"specs_len_{case}"])
    assert feats.shape == ref[f"specs_{case}"].shape
    assert np.abs(feats.numpy() - ref[f"specs_{case}"]).max() < 1e-5
    encoded, _ = model.feature_encoder(feats[None], torch.tensor([length]))
    assert np.abs(encoded[0].numpy() - ref[f"encoded_{case}"]).max() < 1e-5
    units = model(wav)
    assert units.tolist() == ref[f"units_{case}"].tolist()
    # The reference's one-wav path also returns the padding frames' units.
    assert ref[f"units_untrimmed_{case}"].shape[0] >= units.shape[0]


def test_float64_gives_the_same_units(folder: Path, ref: dict) -> None:
    model64 = SpeechToUnit.load(folder, torch.float64)
    for case in CASES:
        wav = torch.from_numpy(ref[f"wav_{case}"]).double()
        assert model64(wav).tolist() == ref[f"units_{case}"].tolist()


def test_units_cover_the_tiny_codebook_and_change_with_audio(model: SpeechToUnit, ref: dict):
    units = model(torch.from_numpy(ref["wav_2"]))
    assert int(units.max()) < 32 and int(units.min()) >= 0
    assert len(set(units.tolist())) > 3
    assert model(torch.from_numpy(ref["wav_2"]).flip(0).contiguous()).tolist() != units.tolist()


def test_emova_hparams_give_emovas_sizes() -> None:
    raw = yaml.safe_load((FIXTURES / "emova_s2u_hparams.yaml").read_text())
    config = S2UConfig.from_hparams(raw)
    assert config.levels == (8, 8, 8, 8) and config.codebook_size == 4096
    assert config.features.features == 128 and config.features.n_fft == 512
    assert (config.features.win_length, config.features.hop_length) == (320, 160)
    strides = [c.stride for convs, _ in config.blocks for c in convs]
    hop_ms = 1000 * config.features.window_stride * int(np.prod(strides))
    assert hop_ms == pytest.approx(40.0)  # 25 units a second
    assert [(t.layers, t.dim, t.heads) for _, t in config.blocks] == [(2, 512, 8), (10, 768, 12)]


def test_unsupported_hparams_name_the_field(folder: Path) -> None:
    raw = yaml.safe_load((folder / "hparams.yaml").read_text())
    raw["encoder"]["preprocessor"]["normalize"] = "all_features"
    with pytest.raises(ValueError, match="encoder.preprocessor.normalize"):
        S2UConfig.from_hparams(raw)
    raw = yaml.safe_load((folder / "hparams.yaml").read_text())
    raw["encoder"]["feature_encoder"]["conv_transformer_blocks"][0]["conv_layers"][0][
        "norm_type"
    ] = "bn"
    with pytest.raises(ValueError, match=r"conv_transformer_blocks\[0\].conv_layers\[0\]"):
        S2UConfig.from_hparams(raw)
    with pytest.raises(ValueError, match="quantizer"):
        S2UConfig.from_hparams({"encoder": raw["encoder"]})


def test_loader_skips_the_ctc_decoder_and_refuses_missing_weights(folder: Path) -> None:
    state = load_file(str(folder / "model.safetensors"))
    assert any(k.startswith("decoder.") for k in state)
    model = SpeechToUnit(
        S2UConfig.from_hparams(yaml.safe_load((folder / "hparams.yaml").read_text()))
    )
    del state["pre_quant.bias"]
    with pytest.raises(ValueError, match="pre_quant.bias"):
        model.load_checkpoint_state(state)


def test_saved_and_reloaded_state_is_the_same_model(folder: Path, tmp_path: Path, ref: dict):
    state = load_file(str(folder / "model.safetensors"))
    (tmp_path / "hparams.yaml").write_text((folder / "hparams.yaml").read_text())
    save_file(state, str(tmp_path / "model.safetensors"))
    wav = torch.from_numpy(ref["wav_1"])
    assert SpeechToUnit.load(tmp_path)(wav).tolist() == ref["units_1"].tolist()
