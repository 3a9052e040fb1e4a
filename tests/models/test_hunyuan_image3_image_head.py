"""HunyuanImage-3's image generation (`families/hunyuan_image3/denoise.py`): its decoder
denoising the image's latent tokens after the context, with the image head, 2-D RoPE,
the image-bidirectional mask, classifier-free guidance and the flow-matching Euler
scheduler, and the VAE decoder, against the reference's modules on the same tiny
random weights.

`tests/fixtures/hunyuan_image3/image_head.pt` is made by `make_image_head_fixture.py`
(its docstring says what is the reference's there and what is not), `vae.pt` by
`make_vae_fixture.py`. Tolerance in float32: 1e-4 absolute on velocities and latents
of magnitude ~1-7 (measured 4.3e-6 and 1.4e-5), 1e-4 relative on the decoded image.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from omnistage.families.hunyuan_image3.denoise import DenoiseRequest, HunyuanImageDenoiser
from omnistage.families.hunyuan_image3.flow_match import (
    NUM_TRAIN_TIMESTEPS,
    FlowMatchEuler,
    flow_sigmas,
)
from omnistage.families.hunyuan_image3.resolution import ratio_index, resolution_group
from omnistage.families.hunyuan_image3.rope2d import image_positions
from omnistage.families.hunyuan_image3.tiny import make_tiny_hunyuan_image3
from omnistage.families.hunyuan_image3.vae_decoder import VaeDecoder

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hunyuan_image3"
FIXTURE = torch.load(FIXTURES / "image_head.pt", weights_only=True)
ATOL = 1e-4


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_hunyuan_image3(tmp_path_factory.mktemp("hy3"), seed=0)


def request(**changes) -> DenoiseRequest:
    h, w = FIXTURE["token_hw"]
    values = dict(
        context=FIXTURE["context"],
        uncond_context=FIXTURE["uncond_context"],
        token_h=h,
        token_w=w,
        steps=FIXTURE["steps"],
        guidance_scale=FIXTURE["guidance_scale"],
        shift=FIXTURE["shift"],
    )
    return DenoiseRequest(**{**values, **changes})


def test_schedule_matches_reference():
    sigmas = flow_sigmas(FIXTURE["steps"], FIXTURE["shift"])
    torch.testing.assert_close(sigmas[:-1] * NUM_TRAIN_TIMESTEPS, FIXTURE["timesteps"])
    with pytest.raises(ValueError, match="num_inference_steps"):
        flow_sigmas(0, 3.0)


def test_scheduler_steps_in_order_only():
    scheduler = FlowMatchEuler(FIXTURE["steps"], FIXTURE["shift"])
    torch.testing.assert_close(scheduler.timesteps, FIXTURE["timesteps"])
    sample = torch.zeros(1, 4, 2, 2)
    with pytest.raises(ValueError, match="not step 0"):
        scheduler.step(torch.ones_like(sample), scheduler.timesteps[1], sample)
    (moved,) = scheduler.step(torch.ones_like(sample), scheduler.timesteps[0], sample)
    sigmas = flow_sigmas(FIXTURE["steps"], FIXTURE["shift"])
    torch.testing.assert_close(moved, torch.full_like(sample, float(sigmas[1] - sigmas[0])))


def test_resolution_group_is_the_references():
    """Sizes `ResolutionGroup(base)` gives in the reference (checked when this was written:
    33 sizes for bases 256 and 1024, the ones below among them, then the Instruct
    reference's 4 extra sizes; tests/models/test_hunyuan_image3_image_sizes.py compares
    whole groups with the reference's)."""
    group = resolution_group(1024)
    assert len(group) == 33 + 4 and group[16] == (1024, 1024)
    assert group[33:] == [(1024, 768), (1280, 720), (768, 1024), (720, 1280)]
    assert group[0] == (512, 2048) and group[32] == (2048, 512) and group[12] == (768, 1280)
    assert resolution_group(256)[12] == (192, 320)  # the fixture's ratio 12: 12 x 20 tokens
    assert ratio_index(256, 192, 320) == 12
    with pytest.raises(ValueError, match="height/width: 200x300"):
        ratio_index(256, 200, 300)


def test_image_positions_are_centred_on_the_image_block():
    pos = image_positions(10, 3, 2, 3)  # 6 image tokens from index 3, then text again
    assert pos[:3].tolist() == [[0, 0], [1, 1], [2, 2]]
    # y = 3 + (6 - 2) / 2 + row, x = 3 + (6 - 3) / 2 + col, truncated.
    assert pos[3:9].tolist() == [[5, 4], [5, 5], [5, 6], [6, 4], [6, 5], [6, 6]]
    assert pos[9].tolist() == [9, 9]


def test_first_velocity_and_final_latents_match_reference(ckpt):
    denoiser = HunyuanImageDenoiser.from_checkpoint(ckpt, torch.float32)
    t = FIXTURE["timesteps"][:1]
    with torch.no_grad():
        v = denoiser.velocity(FIXTURE["context"], FIXTURE["noise"], t)
    torch.testing.assert_close(v, FIXTURE["cond_velocities"][0], atol=ATOL, rtol=0)
    latents = denoiser.generate(request(), FIXTURE["noise"])
    torch.testing.assert_close(latents, FIXTURE["latents"], atol=ATOL, rtol=0)
    assert not torch.allclose(latents, FIXTURE["noise"], atol=0.1)  # it really moved


def test_guidance_one_skips_the_unconditional_pass(ckpt):
    """One denoising step shows it (each step takes the same branch)."""
    denoiser = HunyuanImageDenoiser.from_checkpoint(ckpt, torch.float64)
    noise = FIXTURE["noise"].double()
    plain = denoiser.generate(request(uncond_context=None, steps=1), noise)
    assert torch.equal(denoiser.generate(request(guidance_scale=1.0, steps=1), noise), plain)
    assert not torch.equal(denoiser.generate(request(steps=1), noise), plain)


def test_vae_decoder_matches_reference(ckpt):
    fixture = torch.load(FIXTURES / "vae.pt", weights_only=True)
    config = json.loads((ckpt / "config.json").read_text())
    vae = VaeDecoder(config["vae"], torch.float32)
    vae.load(load_file(str(ckpt / "model.safetensors")))
    with torch.no_grad():
        image = vae(fixture["latents"])
    assert image.shape == (1, 3, 48, 64)  # 16x the 3 x 4 latents
    scale = fixture["image"].abs().max()
    torch.testing.assert_close(image / scale, fixture["image"] / scale, atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="vae.decoder.conv_in.weight"):
        vae.load({})
