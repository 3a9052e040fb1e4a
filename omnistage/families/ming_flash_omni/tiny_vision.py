"""The tiny Ming-flash-omni-2.0 checkpoint's image encoder: a small Qwen3-VL-style ViT
(`vision.*`, transformers' `Qwen3VLVisionModel` names, one deepstack merger as the real one
has three) and the projector (`linear_proj.*`), in `vision.safetensors` beside the
thinker's file (whose bytes, and so its fixture's digest, stay as they were)."""

from __future__ import annotations

from typing import Any

import torch

VISION_WEIGHTS = "vision.safetensors"
IMAGE_SPECIALS = ["<image>", "<imagePatch>", "</image>"]
TINY_VISION: dict[str, Any] = {
    "depth": 2,
    "hidden_size": 32,
    "hidden_act": "gelu_pytorch_tanh",
    "intermediate_size": 48,
    "num_heads": 2,
    "in_channels": 3,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": 48,
    "num_position_embeddings": 16,
    "deepstack_visual_indexes": [0],
}
"""The real ViT's fields at small sizes (real: depth 27, hidden 1152, patch 16,
out_hidden_size 4096, deepstack at 8, 16, 24)."""


def tiny_vision_weights(hidden_size: int, mlp_depth: int, seed: int) -> dict[str, torch.Tensor]:
    """Seeded weights of the ViT and projector, by the checkpoint's names: N(1, 0.1) for
    norm weights, N(0, 0.2) / sqrt(fan-in) for matrices, N(0, 0.05) for other vectors."""
    from omnistage.families.ming_flash_omni.vision import MingFlashImageEncoder

    model = MingFlashImageEncoder(TINY_VISION, hidden_size, mlp_depth)
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, p in model.state_dict().items():
        if ".norm" in name and name.endswith("weight"):
            out[name] = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
        elif p.dim() >= 2:
            fan_in = p[0].numel()
            out[name] = torch.randn(p.shape, generator=g) * (fan_in**-0.5)
        else:
            out[name] = 0.05 * torch.randn(p.shape, generator=g)
    return out
