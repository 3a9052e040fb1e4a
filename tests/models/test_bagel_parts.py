"""Bagel's pieces on their own: the KV rows a context travels as, the checkpoint checks,
the guidance settings' validation and the flow schedule."""

from __future__ import annotations

import json

import pytest
import torch

from omnistage.families.bagel.config import BagelConfig
from omnistage.families.bagel.context import KVContext, from_rows
from omnistage.families.bagel.flow import FlowEulerScheduler, GuidanceSettings, time_points
from omnistage.families.bagel.generator import BagelGenerator
from omnistage.families.bagel.tiny import make_tiny_bagel


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_bagel(tmp_path_factory.mktemp("bagel"), 1)


def test_rows_round_trip_and_rope_is_the_row_count():
    g = torch.Generator().manual_seed(0)
    keys = [torch.randn(5, 2, 4, generator=g, dtype=torch.float64) for _ in range(3)]
    values = [torch.randn(5, 2, 4, generator=g, dtype=torch.float64) for _ in range(3)]
    context = KVContext(keys, values, rope=5)
    back = from_rows(context.to_rows(), 3, 2, 4)
    assert back.rope == 5 and back.length == 5
    for a, b in zip(context.keys + context.values, back.keys + back.values, strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="kv rows"):
        from_rows(torch.zeros(5, 47), 3, 2, 4)


def test_checkpoint_checks_name_what_is_wrong(ckpt, tmp_path):
    with pytest.raises(ValueError, match="no llm_config.json"):
        BagelConfig.load(tmp_path)
    bad = json.loads((ckpt / "ae_config.json").read_text()) | {"downsample": 8}
    (tmp_path / "llm_config.json").write_text((ckpt / "llm_config.json").read_text())
    (tmp_path / "ae_config.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="downsample: 8"):
        BagelConfig.load(tmp_path)
    config = BagelConfig.load(ckpt)
    assert (config.latent_downsample, config.patch_latent_dim) == (4, 16)
    from safetensors.torch import load_file, save_file

    weights = load_file(str(ckpt / "ema.safetensors"))
    del weights["language_model.model.layers.1.self_attn.k_norm_moe_gen.weight"]
    broken = tmp_path / "broken"
    broken.mkdir()
    save_file(weights, str(broken / "ema.safetensors"))
    with pytest.raises(ValueError, match="k_norm_moe_gen"):
        BagelGenerator.load(broken, config, torch.float32)


def test_guidance_settings_refuse_bad_values():
    with pytest.raises(ValueError, match="cfg_renorm_type"):
        GuidanceSettings(renorm_type="nope")
    with pytest.raises(ValueError, match="cfg_interval"):
        GuidanceSettings(interval=(0.8, 0.2))
    settings = GuidanceSettings(interval=(0.4, 1.0))
    assert settings.scales(1.0, 4.0) == (4.0, 1.0)
    assert settings.scales(0.4, 4.0) == (1.0, 1.0)


def test_schedule_is_the_reference_formula():
    points = time_points(4, 3.0)
    t = torch.linspace(1, 0, 5)
    assert torch.equal(points, 3.0 * t / (1 + 2.0 * t))
    scheduler = FlowEulerScheduler(4, 3.0)
    x, v = torch.ones(2, 3), torch.full((2, 3), 2.0)
    (after,) = scheduler.step(v, scheduler.timesteps[0], x)
    assert torch.equal(after, x - v * (points[0] - points[1]))
