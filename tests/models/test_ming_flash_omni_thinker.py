"""Ming-flash-omni-2.0's thinker (Bailing-MoE-V2) on the tiny checkpoint.

- Against the inclusionAI/Ming reference (`tests/fixtures/ming_flash_omni/reference.npz`,
  written by the reference's `BailingMoeV2ForCausalLM` on the checkpoint
  `make_tiny_ming_flash_omni(path, seed=0)` writes; `make_reference_fixture.py` says how):
  greedy ids identical, every step's logits within 1e-4 in float32 (the reference scales
  q before q k^T and sums the experts in another order).
- float64: sync ≡ async exactly, and each request alone ≡ in a batch.
- The checkpoint holds the reference's names; the router keeps to its groups and weighs by
  unbiased scores; unservable config fields are ValueErrors naming them.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors import safe_open

from omnistage import LLM, SamplingParams
from omnistage.families.ming_flash_omni.config import BailingMM2Config, BailingMoeV2Config
from omnistage.families.ming_flash_omni.thinker import BailingV2Gate
from omnistage.families.ming_flash_omni.tiny import make_tiny_ming_flash_omni

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ming_flash_omni" / "reference.npz"


@pytest.fixture(scope="module")
def fixture():
    with np.load(FIXTURE) as data:
        return {k: data[k] for k in data.files}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, fixture):
    path = make_tiny_ming_flash_omni(tmp_path_factory.mktemp("ming-flash"), seed=0)
    meta = json.loads(str(fixture["meta"]))
    digest = hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()
    assert digest == meta["weights_sha256"], "the tiny checkpoint is not the fixture's"
    return path


def _cases(fixture) -> list[int]:
    return sorted(int(k.rsplit("_", 1)[1]) for k in fixture if k.startswith("prompt_ids_"))


def test_greedy_ids_and_logits_match_the_reference(ckpt, fixture):
    llm = LLM(str(ckpt), model_part="thinker", dtype="float32", async_scheduling=False)
    runner = llm.engine.core.executor.runner
    for i in _cases(fixture):
        seen: list[torch.Tensor] = []
        runner.add_sample_observer(lambda event, seen=seen: seen.append(event.logits[0]))
        expected = fixture[f"thinker_ids_{i}"].tolist()
        (out,) = llm.generate(
            [{"prompt_token_ids": fixture[f"prompt_ids_{i}"].tolist()}],
            SamplingParams(temperature=0, max_tokens=len(expected), ignore_eos=True),
            use_tqdm=False,
        )
        assert out.outputs[0].token_ids == expected
        ours = torch.stack(seen[-len(expected) :]).float()
        ref = torch.from_numpy(fixture[f"thinker_logits_{i}"])
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)


def test_float64_sync_equals_async_and_alone_equals_batched(ckpt, fixture):
    prompts = [{"prompt_token_ids": fixture[f"prompt_ids_{i}"].tolist()} for i in _cases(fixture)]
    params = SamplingParams(temperature=0.8, seed=7, max_tokens=12, ignore_eos=True)

    def engine(async_scheduling: bool) -> LLM:
        return LLM(
            str(ckpt),
            model_part="thinker",
            dtype="float64",
            async_scheduling=async_scheduling,
            max_num_batched_tokens=32,  # the long prompt is prefilled in chunks
        )

    def run(llm: LLM, batch: list[dict]) -> list[list[int]]:
        return [o.outputs[0].token_ids for o in llm.generate(batch, params, use_tqdm=False)]

    sync = run(engine(False), prompts)
    llm = engine(True)
    assert run(llm, prompts) == sync
    assert [run(llm, [p])[0] for p in prompts] == sync
    assert all(len(ids) == 12 for ids in sync)


def test_checkpoint_has_the_reference_names(ckpt):
    from omnistage.models.registry import auto_config

    with safe_open(ckpt / "model.safetensors", "pt") as f:
        names = set(f.keys())
    for name in (
        "model.model.word_embeddings.weight",
        "model.model.layers.0.mlp.gate_proj.weight",
        "model.model.layers.1.attention.query_key_value.weight",
        "model.model.layers.1.attention.q_norm.weight",
        "model.model.layers.1.attention.k_norm.weight",
        "model.model.layers.1.attention.dense.weight",
        "model.model.layers.1.mlp.gate.weight",
        "model.model.layers.1.mlp.gate.expert_bias",
        "model.model.layers.1.mlp.image_gate.expert_bias",
        "model.model.layers.1.mlp.audio_gate.weight",
        "model.model.layers.2.mlp.experts.7.down_proj.weight",
        "model.model.layers.2.mlp.shared_experts.up_proj.weight",
        "model.model.norm.weight",
        "model.lm_head.weight",
    ):
        assert name in names, name
    config = auto_config(ckpt)
    assert isinstance(config, BailingMM2Config)
    rope = {"factor": None, "type": "video_rope", "mrope_section": [2, 1, 1]}
    assert config.llm_config.mm_rope_scaling == rope
    saved = json.loads((ckpt / "config.json").read_text())["llm_config"]
    assert saved["rope_scaling"] == rope


def test_router_keeps_to_the_best_groups_and_weighs_by_unbiased_scores():
    config = SimpleNamespace(
        num_experts=8,
        hidden_size=8,
        n_group=4,
        topk_group=2,
        num_experts_per_tok=2,
        routed_scaling_factor=2.5,
    )
    gate = BailingV2Gate(config, torch.float64)
    # One token whose logit for expert e is logits[e] (W = I on the first 8 dims).
    gate.weight.copy_(torch.eye(8, dtype=torch.float64))
    logits = torch.tensor([[3.0, -9.0, 0.5, 0.4, 0.3, 0.2, -1.0, -2.0]], dtype=torch.float64)
    gate.expert_bias.copy_(torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.9, 0.9]))
    weights, experts = gate(logits)
    # Groups (sum of their two biased scores): {0,1} 0.95+0.0001, {2,3} 1.22, {4,5} 1.12,
    # {6,7} 0.27+0.9+0.12+0.9 = 2.19 -> groups {2,3} and {6,7}; expert 0 (the best
    # unbiased score) is in a dropped group.
    order = experts[0].argsort()
    assert experts[0][order].tolist() == [6, 7]
    scores = torch.sigmoid(logits[0, [6, 7]])
    torch.testing.assert_close(weights[0][order], 2.5 * scores / scores.sum())


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"hidden_act": "gelu"}, "llm_config.hidden_act"),
        ({"rope_scaling": {"type": "yarn"}}, "llm_config.rope_scaling"),
        ({"router_type": "expert_choice"}, "llm_config.router_type"),
        ({"n_group": 3}, "llm_config.n_group"),
        ({"topk_group": 9}, "llm_config.topk_group"),
        ({"num_experts_per_tok": 9}, "llm_config.num_experts_per_tok"),
        ({"partial_rotary_factor": 0.1}, "llm_config.partial_rotary_factor"),
        ({"moe_intermediate_size": None}, "llm_config.moe_intermediate_size"),
    ],
)
def test_unservable_config_fields_are_value_errors_naming_them(kwargs, field):
    base = dict(
        hidden_size=64,
        num_attention_heads=4,
        num_experts=8,
        n_group=4,
        topk_group=2,
        moe_intermediate_size=32,
    )
    with pytest.raises(ValueError, match=field):
        BailingMoeV2Config(**{**base, **kwargs})
