"""Rotary position embedding: plain RoPE frequencies (`DefaultRope`), the cos/sin tables
over every position (`RotaryEmbedding`, any rope type through transformers' rotary
module) and multimodal RoPE's choice of position row per frequency."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class DefaultRope:
    """transformers' `rope_type: default` frequencies, computed as its
    `compute_default_rope_parameters` does (Llama, Qwen2, Qwen3 and their MoE
    variants share it) but without importing transformers' modeling code (~0.35 s
    at start): inv_freq = 1 / base^(2i / head_dim), no attention scaling."""

    attention_scaling = 1.0

    def __init__(self, config: Any) -> None:
        base = config.rope_parameters["rope_theta"]
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))

    @staticmethod
    def applies_to(config: Any) -> bool:
        """Whether `config` asks for plain RoPE (no scaling of any kind)."""
        params = getattr(config, "rope_parameters", None)
        return (
            isinstance(params, dict)
            and params.get("rope_type", "default") == "default"
            and "rope_theta" in params
        )


class RotaryEmbedding(nn.Module):
    """Neox-style rotary embedding with a cos/sin table over every position.

    The inverse frequencies (and any rope scaling: llama3, yarn, linear…) come
    from the transformers rotary module of the architecture, so every rope type
    transformers knows is handled the same way; `DefaultRope` stands in for it
    where a model asks for plain RoPE.
    """

    def __init__(self, hf_rotary: Any, max_positions: int, dtype: torch.dtype) -> None:
        super().__init__()
        inv_freq = hf_rotary.inv_freq.float()
        scaling = float(getattr(hf_rotary, "attention_scaling", 1.0))
        t = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", (emb.cos() * scaling).to(dtype), persistent=False)
        self.register_buffer("sin", (emb.sin() * scaling).to(dtype), persistent=False)
        self.register_buffer("mrope_rows", None, persistent=False)
        """[d] int64 position row per table column (mrope), None: 1-D positions only."""
        self.register_buffer("_columns", None, persistent=False)

    def enable_mrope(self, section: list[int], interleaved: bool) -> None:
        """Also rotate with [3, T] (T, H, W) positions (multimodal RoPE): each of the
        `d / 2` frequencies takes the position of one row (`mrope_frequency_rows`). Every
        table entry is `cos/sin(position * inv_freq)` computed in float32, so picking
        entries per frequency equals transformers' float32 recomposition exactly."""
        self.enable_position_rows(
            mrope_frequency_rows(self.cos.shape[1] // 2, section, interleaved)
        )

    def enable_position_rows(self, rows: torch.Tensor) -> None:
        """Also rotate with [3, T] positions, frequency `i` by row `rows[i]` of them ([d / 2]
        int64 in 0..2; e.g. HunyuanImage-3's 2-D RoPE: rows 1, 2, 1, 2, …)."""
        device = self.cos.device
        self.mrope_rows = torch.cat([rows, rows]).to(device)
        self._columns = torch.arange(2 * len(rows), device=device)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, d] of [T] positions, or of [3, T] positions with mrope enabled."""
        if positions.ndim == 1:
            return self.cos[positions], self.sin[positions]
        if self.mrope_rows is None:
            raise ValueError("3-D rotary positions for a model without multimodal RoPE")
        # [d, T] -> [T, d]: the position each (token, frequency) takes, from its row.
        index = positions[self.mrope_rows].t()
        return self.cos[index, self._columns], self.sin[index, self._columns]

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [T, heads, d], k: [T, kv_heads, d]; positions [T] or (mrope) [3, T]."""
        cos, sin = self.tables(positions)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return rotate(q, cos, sin), rotate(k, cos, sin)


def mrope_frequency_rows(half: int, section: list[int], interleaved: bool) -> torch.Tensor:
    """[half] int64: the position row (0 T, 1 H, 2 W) each rotary frequency takes.

    Interleaved (Qwen3-Omni, Qwen3-VL: `recomposition_frequencies`): frequency `i` takes H
    if `i % 3 == 1 and i < 3 * section[1]`, W if `i % 3 == 2 and i < 3 * section[2]`, else
    T. Not interleaved (Qwen2-VL, Qwen2.5-Omni: `apply_multimodal_rotary_pos_emb`): the
    first `section[0]` frequencies take T, the next `section[1]` H, the rest W.
    """
    i = torch.arange(half)
    rows = torch.zeros(half, dtype=torch.long)
    if interleaved:
        rows[(i % 3 == 1) & (i < 3 * section[1])] = 1
        rows[(i % 3 == 2) & (i < 3 * section[2])] = 2
    else:
        rows[i >= section[0]] = 1
        rows[i >= section[0] + section[1]] = 2
    return rows


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`x` rotated by (cos, sin), neox style (the two halves of each head pair up)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
