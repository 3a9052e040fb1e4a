"""Ming-flash-omni-2.0's talker heads on tiny seeded weights: the flow-matching head (DiT
sampler) and the aggregator, against the reference (`heads_reference.npz`, written by
inclusionAI/Ming-omni-tts's `FlowLoss.sample` and `Aggregator`; `make_heads_fixture.py`
says how).

- a seeded request's two successive patches equal the reference's under
  `torch.manual_seed` (same seed, same draws), at temperature 0 and 1.5, within 1e-5;
- the aggregator's embeddings equal the reference's within 1e-5;
- a patch depends only on its request's generator: the same seed gives the same patch,
  another seed another one.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from omnistage.families.ming_flash_omni.flow_head import FlowHead, slide_history
from omnistage.families.ming_flash_omni.talker_heads import (
    HeadSettings,
    load_heads,
    make_tiny_heads,
)

FIXTURE = (
    Path(__file__).resolve().parents[1] / "fixtures" / "ming_flash_omni" / "heads_reference.npz"
)


@pytest.fixture(scope="module")
def fixture():
    with np.load(FIXTURE) as data:
        return {k: data[k] for k in data.files}


@pytest.fixture(scope="module")
def heads(tmp_path_factory, fixture):
    folder = make_tiny_heads(tmp_path_factory.mktemp("heads"), seed=0)
    digest = hashlib.sha256((folder / "heads.safetensors").read_bytes()).hexdigest()
    assert digest == json.loads(str(fixture["meta"]))["weights_sha256"]
    return load_heads(folder, torch.float32)


@pytest.mark.parametrize("case", ["cold", "warm"])
def test_two_successive_patches_match_the_reference(heads, fixture, case):
    settings, dit, _ = heads
    seed, temperature = json.loads(str(fixture["meta"]))["cases"][case]
    head = FlowHead(dit, settings.latent_dim, settings.patch_size)
    cond = torch.from_numpy(fixture[f"{case}_cond"])
    history = torch.from_numpy(fixture[f"{case}_history"])
    g = torch.Generator().manual_seed(seed)
    first = head.sample(cond, history, g, cfg=2.0, sigma=0.25, temperature=temperature)
    second = head.sample(cond, slide_history(history, first), g, 2.0, 0.25, temperature)
    torch.testing.assert_close(
        first, torch.from_numpy(fixture[f"{case}_first"]), rtol=1e-5, atol=1e-5
    )
    torch.testing.assert_close(
        second, torch.from_numpy(fixture[f"{case}_second"]), rtol=1e-5, atol=1e-5
    )


def test_aggregator_matches_the_reference(heads, fixture):
    _, _, agg = heads
    with torch.no_grad():
        out = agg(torch.from_numpy(fixture["agg_in"]))
    torch.testing.assert_close(out, torch.from_numpy(fixture["agg_out"]), rtol=1e-5, atol=1e-5)


def test_a_patch_is_a_function_of_its_own_seed(heads, fixture):
    settings, dit, _ = heads
    head = FlowHead(dit, settings.latent_dim, settings.patch_size)
    cond = torch.from_numpy(fixture["warm_cond"])
    history = torch.from_numpy(fixture["warm_history"])

    def patch(seed: int) -> torch.Tensor:
        return head.sample(cond, history, torch.Generator().manual_seed(seed), temperature=1.5)

    assert torch.equal(patch(3), patch(3))
    assert not torch.allclose(patch(3), patch(4))


def test_head_settings_refuse_bad_sizes_naming_the_field():
    with pytest.raises(ValueError, match="talker_config.patch_size"):
        HeadSettings(latent_dim=8, patch_size=0, history_patch_size=8, llm_hidden_size=24)
    with pytest.raises(ValueError, match="talker_config.flowmodel.hidden_size"):
        HeadSettings(8, 4, 8, 24, flowmodel={"hidden_size": 30, "num_heads": 4})
