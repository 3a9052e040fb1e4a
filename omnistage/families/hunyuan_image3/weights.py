"""Loading one sub-module of the HunyuanImage-3 checkpoint (VAE encoder / decoder, vision
encoder) from the checkpoint's tensors, every parameter checked by name and shape."""

from __future__ import annotations

import torch
from torch import nn


def load_part(module: nn.Module, weights: dict[str, torch.Tensor], prefix: str, what: str) -> None:
    """Copy `weights[prefix + name]` into each parameter of `module`; a ValueError names a
    missing (`what` weight ...) or misshapen tensor."""
    for name, param in module.named_parameters():
        key = f"{prefix}{name}"
        if key not in weights:
            raise ValueError(f"checkpoint: {what} weight {key!r} is missing")
        if weights[key].shape != param.shape:
            raise ValueError(f"checkpoint: {key!r} has shape {tuple(weights[key].shape)}")
        param.copy_(weights[key].to(param.dtype))
