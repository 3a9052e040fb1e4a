"""Tiny Qwen3-Next / Qwen3.5 checkpoints with multi-token-prediction (`mtp.*`) weights.

transformers does not create MTP weights, so `make_mtp_checkpoint` saves a tiny
checkpoint (`tiny_models.make_checkpoint`), then adds seeded random `mtp.*`
tensors in the released checkpoints' names and layout (per-expert MoE weights
for Qwen3-Next, a dense SwiGLU for Qwen3.5) to its safetensors file and
`mtp_num_hidden_layers` to its config.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from omnistage.models.tiny_checkpoints import make_checkpoint, tiny_config

ARCHES = ("qwen3_next", "qwen3_5")


def make_mtp_checkpoint(
    path: Path,
    arch: str = "qwen3_next",
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    num_mtp_layers: int = 1,
    **overrides: Any,
) -> Path:
    """A seeded random `arch` checkpoint (config overrides allowed) with `num_mtp_layers`
    MTP layers."""
    if arch not in ARCHES:
        raise ValueError(f"arch: expected one of {', '.join(ARCHES)}, got {arch!r}")
    make_checkpoint(path, arch, seed=seed, dtype=dtype, **overrides)
    config = tiny_config(arch, **overrides)
    generator = torch.Generator().manual_seed(seed + 1000)
    extra = {
        name: _random(shape, dtype, generator)
        for name, shape in mtp_shapes(config, arch, num_mtp_layers).items()
    }
    weights = path / "model.safetensors"
    tensors = load_file(weights)
    tensors.update(extra)
    save_file(tensors, weights, metadata={"format": "pt"})
    config_file = path / "config.json"
    saved = json.loads(config_file.read_text())
    saved["mtp_num_hidden_layers"] = num_mtp_layers
    config_file.write_text(json.dumps(saved, indent=2))
    return path


def mtp_shapes(config: Any, arch: str, num_mtp_layers: int) -> dict[str, tuple[int, ...]]:
    """HF name -> shape of every `mtp.*` tensor of a checkpoint of `config`."""
    hidden = config.hidden_size
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    shapes: dict[str, tuple[int, ...]] = {
        "mtp.fc.weight": (hidden, 2 * hidden),
        "mtp.pre_fc_norm_embedding.weight": (hidden,),
        "mtp.pre_fc_norm_hidden.weight": (hidden,),
        "mtp.norm.weight": (hidden,),
    }
    for i in range(num_mtp_layers):
        layer = f"mtp.layers.{i}"
        shapes.update(
            {
                f"{layer}.input_layernorm.weight": (hidden,),
                f"{layer}.post_attention_layernorm.weight": (hidden,),
                f"{layer}.self_attn.q_proj.weight": (2 * heads * head_dim, hidden),
                f"{layer}.self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
                f"{layer}.self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
                f"{layer}.self_attn.o_proj.weight": (hidden, heads * head_dim),
                f"{layer}.self_attn.q_norm.weight": (head_dim,),
                f"{layer}.self_attn.k_norm.weight": (head_dim,),
            }
        )
        if arch == "qwen3_next" and _sparse(config, i):
            inter = config.moe_intermediate_size
            shapes[f"{layer}.mlp.gate.weight"] = (config.num_experts, hidden)
            for e in range(config.num_experts):
                shapes.update(_swiglu(f"{layer}.mlp.experts.{e}", hidden, inter))
            shared = config.shared_expert_intermediate_size
            shapes.update(_swiglu(f"{layer}.mlp.shared_expert", hidden, shared))
            shapes[f"{layer}.mlp.shared_expert_gate.weight"] = (1, hidden)
        else:
            shapes.update(_swiglu(f"{layer}.mlp", hidden, config.intermediate_size))
    return shapes


def _sparse(config: Any, layer_idx: int) -> bool:
    """The MoE rule of the decoder layers, applied to the MTP layer's own index."""
    return (
        layer_idx not in (getattr(config, "mlp_only_layers", None) or [])
        and config.num_experts > 0
        and (layer_idx + 1) % config.decoder_sparse_step == 0
    )


def _swiglu(prefix: str, hidden: int, inter: int) -> dict[str, tuple[int, ...]]:
    return {
        f"{prefix}.gate_proj.weight": (inter, hidden),
        f"{prefix}.up_proj.weight": (inter, hidden),
        f"{prefix}.down_proj.weight": (hidden, inter),
    }


def _random(shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    # As make_checkpoint: well-separated logits; norms store the offset from one.
    std = 0.2 if len(shape) >= 2 else 0.1
    return (torch.randn(shape, generator=generator, dtype=torch.float64) * std).to(dtype)
