"""Building blocks of decoder models: RMSNorm, rotary embedding, fused linear loading."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """RMS normalisation, computed in at least float32 (as transformers does)."""

    def __init__(self, size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype), requires_grad=False)
        self.eps = eps
        self.compute_dtype = torch.float64 if dtype == torch.float64 else torch.float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(self.compute_dtype)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class RotaryEmbedding(nn.Module):
    """Neox-style rotary embedding with a cos/sin table over every position.

    The inverse frequencies (and any rope scaling: llama3, yarn, linear…) come
    from the transformers rotary module of the architecture, so every rope type
    transformers knows is handled the same way.
    """

    def __init__(self, hf_rotary: nn.Module, max_positions: int, dtype: torch.dtype) -> None:
        super().__init__()
        inv_freq = hf_rotary.inv_freq.float()
        scaling = float(getattr(hf_rotary, "attention_scaling", 1.0))
        t = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", (emb.cos() * scaling).to(dtype), persistent=False)
        self.register_buffer("sin", (emb.sin() * scaling).to(dtype), persistent=False)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [T, heads, d], k: [T, kv_heads, d]."""
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def load_shard(param: torch.Tensor, shard: torch.Tensor, offset: int) -> None:
    """Copy one part of a fused weight (q of qkv, gate of gate_up…) into rows [offset, offset+n)."""
    rows = shard.shape[0]
    if offset + rows > param.shape[0] or shard.shape[1:] != param.shape[1:]:
        raise ValueError(
            f"weight shape {tuple(shard.shape)} does not fit fused parameter "
            f"{tuple(param.shape)} at row {offset}"
        )
    param[offset : offset + rows].copy_(shard)
