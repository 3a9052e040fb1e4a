"""HunyuanImage-3's 2-D rotary positions for a sequence holding one generated image, and
the attention mask of a denoising step.

Text tokens take position (p, p), which is plain RoPE. The image's h x w tokens, from
sequence index L, take (row, column) positions centred on the block the reference
reserves for them (`build_2d_rope`): y = L + (w*h - h)/2 + row, x = L + (w*h - w)/2 +
col, truncated to integers as the reference's `.long()` does; text after the image
continues from L + w*h. Frequency i of the head (i < d/2, base^(-2i/d)) rotates by the
row position for even i and by the column position for odd i; the table is
`cat(angles, angles)`, the neox layout the decoder's RoPE uses.

The mask is causal, except that the image tokens see each other both ways.
"""

from __future__ import annotations

import torch


def image_positions(seq_len: int, start: int, h: int, w: int) -> torch.Tensor:
    """[seq_len, 2] int64 (y, x) positions of a sequence whose image tokens are
    [start, start + h*w) (every other token keeps (index, index))."""
    pos = torch.arange(seq_len, dtype=torch.int64)
    y, x = pos.clone(), pos.clone()
    n = h * w
    rows = torch.arange(h, dtype=torch.float64).repeat_interleave(w)
    cols = torch.arange(w, dtype=torch.float64).repeat(h)
    y[start : start + n] = (start + (n - h) / 2 + rows).long()
    x[start : start + n] = (start + (n - w) / 2 + cols).long()
    return torch.stack([y, x], dim=1)


def rope_tables(
    positions: torch.Tensor, head_dim: int, base: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, head_dim] of [T, 2] (y, x) positions."""
    theta = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    axis = torch.arange(head_dim // 2) % 2  # 0: the row position, 1: the column position
    angles = positions[:, axis].float() * theta
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def denoise_mask(seq_len: int, start: int, n: int) -> torch.Tensor:
    """[T, T] bool: causal, and the image tokens [start, start + n) all see each other."""
    mask = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
    mask[start : start + n, start : start + n] = True
    return mask


def context_mask(seq_len: int, spans: tuple[tuple[int, int], ...]) -> torch.Tensor:
    """[T, T] bool: causal, and the rows of each [start, end) span see each other (an input
    image's block of runs, as the reference's joint-image mask)."""
    mask = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
    for start, end in spans:
        mask[start:end, start:end] = True
    return mask
