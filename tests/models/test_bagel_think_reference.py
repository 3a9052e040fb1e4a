"""Bagel's text-to-image with thinking equals the reference's `think=True` path on the tiny
checkpoint (float32).

`tests/fixtures/bagel/think_reference.npz` was written by Bagel's own
`InterleaveInferencer.interleave_inference([prompt], think=True)` (`make_reference_fixture.py`,
beside it): greedy thinking after the system and prompt blocks, the thinking prefilled,
then the image; with guidance, the text branch over the system block alone and the image
branch over the system and prompt blocks. Our `thinking.think_alone` builds the same
contexts; from the reference's initial noise the final latents agree within 5e-6 and the
images are equal (up to pixels on a rounding edge), and the thinking ids are the same. The
cases stop the thinking after one token: see the script on why.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from omnistage.families.bagel.flow import FlowEulerScheduler, GuidanceSettings
from omnistage.families.bagel.text_to_image import BagelImageModel
from omnistage.families.bagel.thinking import think_alone
from omnistage.families.bagel.tiny import make_tiny_bagel

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "bagel" / "think_reference.npz"
LATENT_ATOL = 5e-6


@pytest.fixture(scope="module")
def reference():
    data = np.load(FIXTURE)
    meta = json.loads(str(data["meta"]))
    arrays = {k: torch.from_numpy(data[k]) for k in data.files if k != "meta"}
    return meta, arrays


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return BagelImageModel(make_tiny_bagel(tmp_path_factory.mktemp("bagel"), 0), torch.float32)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_checkpoint_is_the_one_the_reference_read(model, reference):
    meta, _ = reference
    assert _sha(model.path / "ema.safetensors") == meta["ema_sha256"]


@pytest.mark.parametrize("case", ["think_no_cfg", "think_cfg"])
def test_thinking_then_drawing_matches_reference(model, reference, case):
    meta, arrays = reference
    s = meta["cases"][case]
    text_scale = s["cfg_text_scale"]
    thinking, contexts = think_alone(
        model, meta["prompt"], s["max_think_token_n"] - 1, text_scale > 1.0
    )
    assert thinking == arrays[f"{case}.thinking_ids"].tolist()
    assert model.tokenizer.decode(thinking) == s["thinking"]
    settings = GuidanceSettings(
        img_scale=s["cfg_img_scale"],
        interval=tuple(s["cfg_interval"]),
        renorm_min=s.get("cfg_renorm_min", 0.0),
        renorm_type=s["cfg_renorm_type"],
    )
    height, width = meta["size"]
    block = model.generator.block(height, width)
    scheduler = FlowEulerScheduler(s["num_timesteps"] - 1, s["timestep_shift"])
    x = arrays[f"{case}.noise"]
    for t in scheduler.timesteps:
        v = model.velocity(x, float(t), block, contexts, text_scale, settings)
        x = scheduler.step(v, t, x)[0]
    err = (x - arrays[f"{case}.latents"]).abs().max().item()
    assert err <= LATENT_ATOL, f"{case}: latents differ by {err}"
    diff = (model.to_pixels(x, block).int() - arrays[f"{case}.image"].int()).abs()
    assert diff.max() <= 1 and (diff > 0).float().mean() < 0.01


def test_thinking_changes_the_image(model, reference):
    """Against the same noise without thinking, the reference's picture differs: the
    fixture exercises the thinking context at all."""
    meta, arrays = reference
    s = meta["cases"]["think_no_cfg"]
    height, width = meta["size"]
    latents, _ = model.generate(
        meta["prompt"], height, width, s["num_timesteps"] - 1, arrays["think_no_cfg.noise"]
    )
    assert (latents - arrays["think_no_cfg.latents"]).abs().max() > 0.05
