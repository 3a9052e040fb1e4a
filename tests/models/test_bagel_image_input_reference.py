"""Bagel with an input image equals the reference implementation on the tiny checkpoint.

`tests/fixtures/bagel/image_input_reference.npz` was written by Bagel's own
`InterleaveInferencer` (`make_reference_fixture.py`, beside it) on the checkpoint
`make_tiny_bagel(path, 0)` writes, from an input image of 24 x 32 pixels stored in it:

- **editing** (`[image, instruction]`: the VAE block and the ViT block of the image,
  then the text; guidance without the text = the image context, without the image =
  the text alone) for three guidance settings, from the reference's own draws of the
  VAE posterior noise and the initial noise. Tolerance (float32): final latents within
  5e-6 absolute (measured 1.3e-6), images equal except pixels on a rounding edge (at
  most 1 level, under 1% of values; measured: equal);
- **understanding** (`[image, question]`: the ViT block alone, then the text; greedy
  text): the ids are identical.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from omnistage.families.bagel.flow import GuidanceSettings
from omnistage.families.bagel.text_to_image import BagelImageModel
from omnistage.families.bagel.tiny import make_tiny_bagel

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "bagel" / "image_input_reference.npz"
LATENT_ATOL = 5e-6
EDITS = ["edit_cfg", "edit_text_channel", "edit_channel_min"]


@pytest.fixture(scope="module")
def reference():
    data = np.load(FIXTURE)
    meta = json.loads(str(data["meta"]))
    meta["arrays"] = {k: torch.from_numpy(data[k]) for k in data.files if k != "meta"}
    return meta


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return BagelImageModel(make_tiny_bagel(tmp_path_factory.mktemp("bagel"), 0), torch.float32)


def test_checkpoint_is_the_one_the_reference_read(model, reference):
    for name, key in (("ema.safetensors", "ema_sha256"), ("ae.safetensors", "ae_sha256")):
        assert hashlib.sha256((model.path / name).read_bytes()).hexdigest() == reference[key]


@pytest.mark.parametrize("case", EDITS)
def test_edit_matches_reference(model, reference, case):
    s, arrays = reference["cases"][case], reference["arrays"]
    settings = GuidanceSettings(
        img_scale=s["cfg_img_scale"],
        interval=tuple(s["cfg_interval"]),
        renorm_min=s.get("cfg_renorm_min", 0.0),
        renorm_type=s["cfg_renorm_type"],
    )
    image_in = arrays["input_image"].numpy()
    height, width = image_in.shape[:2]
    latents, image = model.generate(
        [image_in, reference["edit_prompt"]],
        height,
        width,
        s["num_timesteps"] - 1,
        arrays[f"{case}.noise"],
        text_scale=s["cfg_text_scale"],
        settings=settings,
        shift=s["timestep_shift"],
        encode_noise=arrays[f"{case}.encode_noise"],
    )
    ref_latents, ref_image = arrays[f"{case}.latents"], arrays[f"{case}.image"]
    assert latents.shape == ref_latents.shape and image.shape == ref_image.shape
    err = (latents - ref_latents).abs().max().item()
    assert err <= LATENT_ATOL, f"{case}: latents differ by {err}"
    diff = (image.int() - ref_image.int()).abs()
    assert diff.max() <= 1 and (diff > 0).float().mean() < 0.01


def test_understanding_matches_reference(model, reference):
    arrays = reference["arrays"]
    case = reference["cases"]["understand"]
    image_in = arrays["input_image"].numpy()
    context = model.contexts([image_in, reference["question"]], False, understanding=True).full
    ids = model.answer(context, case["max_think_token_n"] - 1)
    # The reference's sequence starts with the `<|im_start|>` it feeds first.
    assert [model.bos, *ids] == arrays["understand.text_ids"].tolist()
    assert len(set(ids)) > 3, "the fixture's answer should not be one repeated id"


def test_image_context_layout(model, reference):
    """The edit context holds the VAE block, the ViT block and the text, at the RoPE
    positions the reference gives them: one per image block, one per text token."""
    image_in = reference["arrays"]["input_image"].numpy()
    prompt = reference["edit_prompt"]
    contexts = model.contexts([image_in, prompt], guidance=True)
    vae_tokens = (24 // 4) * (32 // 4)
    vit_tokens = (24 // 4) * (32 // 4)
    text = len(model.prompt_ids(prompt))
    assert contexts.no_text.length == vae_tokens + 2 + vit_tokens + 2
    assert contexts.no_text.rope == 2
    assert contexts.full.length == contexts.no_text.length + text
    assert contexts.full.rope == 2 + text
    assert contexts.no_image.length == text and contexts.no_image.rope == text
    understanding = model.contexts([image_in, prompt], guidance=False, understanding=True)
    assert understanding.full.length == vit_tokens + 2 + text
    assert understanding.no_text is None and understanding.no_image is None


def test_edit_cases_differ(reference):
    arrays = reference["arrays"]
    a, b = arrays["edit_cfg.latents"], arrays["edit_channel_min.latents"]
    assert (a - b).abs().max() > 0.1
