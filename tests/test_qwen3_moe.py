"""Qwen3-MoE specifics: both expert weight layouts load to the same model."""

from __future__ import annotations

import re
import shutil

import torch
from safetensors.torch import load_file, save_file

from omnistage import LLM, SamplingParams


def test_stacked_expert_weights_load_like_per_expert_ones(tiny_qwen3_moe, tmp_path):
    stacked_dir = tmp_path / "stacked"
    shutil.copytree(tiny_qwen3_moe, stacked_dir)
    weights = load_file(str(tiny_qwen3_moe / "model.safetensors"))
    per_expert = re.compile(
        r"^(model\.layers\.\d+\.mlp)\.experts\.(\d+)\.(gate|up|down)_proj\.weight$"
    )
    experts: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    out = {}
    for name, tensor in weights.items():
        if m := per_expert.match(name):
            experts.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = tensor
        else:
            out[name] = tensor
    assert experts, "the tiny checkpoint has sparse layers"
    for block, by_expert in experts.items():
        order = sorted(by_expert)
        out[f"{block}.experts.gate_up_proj"] = torch.stack(
            [torch.cat([by_expert[e]["gate"], by_expert[e]["up"]]) for e in order]
        )
        out[f"{block}.experts.down_proj"] = torch.stack([by_expert[e]["down"] for e in order])
    save_file(out, str(stacked_dir / "model.safetensors"))

    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = [{"prompt_token_ids": list(range(30, 60))}, {"prompt_token_ids": [7, 8, 9]}]
    results = []
    for path in (tiny_qwen3_moe, stacked_dir):
        llm = LLM(str(path), async_scheduling=False)
        results.append(
            [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        )
    assert results[0] == results[1]
