"""HunyuanImage-3's encoders of an input image against the reference's modules on the same
tiny random weights: the vision encoder (`vision.py`: SigLIP2 and its aligner under the
checkpoint's `vision_model.*` / `vision_aligner.*` names) and the VAE encoder
(`vae_encoder.py`, `vae.encoder.*`).

`vision.pt` is made by `make_vision_fixture.py` (the reference's `Siglip2VisionTransformer`
and `LightProjector`, patches cut by transformers' `Siglip2ImageProcessor`),
`vae_encoder.pt` by `make_vae_encoder_fixture.py` (`AutoencoderKLConv3D.encode`).
Tolerances in float32: 1e-5 absolute on the patches (measured 0), 1e-4 on the rows of
magnitude ~3 (measured 1.2e-6); 1e-5 relative to the largest value on the VAE's
posterior (random weights make it ~1e3; measured 1e-6; the reference clamps the
log-variance to [-30, 20]).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from omnistage.families.hunyuan_image3.config import HunyuanImage3Config
from omnistage.families.hunyuan_image3.denoise import read_weights
from omnistage.families.hunyuan_image3.tiny import make_tiny_hunyuan_image3
from omnistage.families.hunyuan_image3.vae_encoder import VaeEncoder
from omnistage.families.hunyuan_image3.vision import HunyuanVisionEncoder

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hunyuan_image3"
FIXTURE = torch.load(FIXTURES / "vision.pt", weights_only=True)


@pytest.fixture(scope="module")
def config_and_weights(tmp_path_factory):
    path = make_tiny_hunyuan_image3(tmp_path_factory.mktemp("hy3v"), seed=0)
    config = HunyuanImage3Config(**json.loads((path / "config.json").read_text()))
    return config, read_weights(path)


def test_patches_and_rows_match_reference(config_and_weights):
    config, weights = config_and_weights
    encoder = HunyuanVisionEncoder(config, torch.float32)
    encoder.load(weights)
    patches = encoder.patches(FIXTURE["image"].numpy())
    assert patches["spatial_shapes"].tolist() == FIXTURE["spatial_shapes"].tolist() == [[3, 5]]
    assert torch.equal(
        patches["pixel_attention_mask"].bool(), FIXTURE["pixel_attention_mask"].bool()
    )
    torch.testing.assert_close(patches["pixel_values"], FIXTURE["pixel_values"], atol=1e-5, rtol=0)
    rows = encoder(patches)
    assert rows.shape == (encoder.num_tokens, config.hidden_size) == (16, 64)
    torch.testing.assert_close(rows, FIXTURE["rows"], atol=1e-4, rtol=0)


def test_missing_weight_and_bad_config_are_named(config_and_weights):
    config, weights = config_and_weights
    encoder = HunyuanVisionEncoder(config, torch.float32)
    with pytest.raises(ValueError, match="vision_aligner.layers.0.weight"):
        encoder.load({k: v for k, v in weights.items() if k != "vision_aligner.layers.0.weight"})
    bad = HunyuanImage3Config(
        **{**config.to_dict(), "vit_aligner": {**config.vit_aligner, "projector_type": "qformer"}}
    )
    with pytest.raises(ValueError, match="vit_aligner.projector_type"):
        HunyuanVisionEncoder(bad, torch.float32)
    with pytest.raises(ValueError, match="vit: the checkpoint's config has no vision encoder"):
        HunyuanVisionEncoder(
            HunyuanImage3Config(**{**config.to_dict(), "vit": None}), torch.float32
        )


def _close_relative(a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor) -> None:
    torch.testing.assert_close(a / scale, b / scale, atol=1e-5, rtol=0)


def test_vae_encoder_matches_reference(config_and_weights):
    config, weights = config_and_weights
    fixture = torch.load(FIXTURES / "vae_encoder.pt", weights_only=True)
    vae = VaeEncoder(config.vae, torch.float32)
    vae.load(weights)
    with torch.no_grad():
        moments = vae.moments(fixture["image"])
        latents = vae(fixture["image"])
    assert latents.shape == (1, 4, 3, 4)  # 48 x 64 pixels, 16x down
    scale = moments.abs().max()  # the output's magnitude (the reference clamps logvar)
    _close_relative(moments[:, :4], fixture["mean"], scale)
    _close_relative(moments[:, 4:].clamp(-30.0, 20.0), fixture["logvar"], scale)
    _close_relative(latents, fixture["latents"], fixture["latents"].abs().max())
    with pytest.raises(ValueError, match="vae.encoder.conv_in.weight"):
        vae.load({})
