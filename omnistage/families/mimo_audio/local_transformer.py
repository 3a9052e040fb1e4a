"""`LocalTransformer`: the LM's small Qwen2 stacks that run inside one LM position.

MiMo-Audio's LM holds two of them besides its main decoder, both a transformers
`Qwen2Model` without token embeddings in the reference (so here by the same names:
`layers.{i}.self_attn.{q,k,v,o}_proj`, `layers.{i}.mlp.{gate,up,down}_proj`,
`layers.{i}.{input,post_attention}_layernorm`, `norm`):

- `input_local_transformer` (the patch encoder): over the `group_size` frames of one
  position, full attention when `input_full_attention`, no cache;
- `local_transformer` (the patch decoder): one row at a time, with a cache that lives
  for one position's `group_size + max(delay)` steps.

Sequences are short (4 to 11 rows), so this is plain torch: SDPA, RoPE computed as
transformers' Qwen2 does it (float32 angles, cast to the stack's dtype).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.mimo_audio.config import LocalConfig


class _RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float() if dtype in (torch.float16, torch.bfloat16) else x
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class _Layer(nn.Module):
    def __init__(self, c: LocalConfig) -> None:
        super().__init__()
        width, inner = c.hidden_size, c.intermediate_size
        self.heads, self.head_dim = c.num_heads, c.head_dim
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(width, width, bias=True)
        self.self_attn.k_proj = nn.Linear(width, width, bias=True)
        self.self_attn.v_proj = nn.Linear(width, width, bias=True)
        self.self_attn.o_proj = nn.Linear(width, width, bias=False)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(width, inner, bias=False)
        self.mlp.up_proj = nn.Linear(width, inner, bias=False)
        self.mlp.down_proj = nn.Linear(inner, width, bias=False)
        self.input_layernorm = _RMSNorm(width, c.rms_norm_eps)
        self.post_attention_layernorm = _RMSNorm(width, c.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: list[torch.Tensor] | None,
        causal: bool,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        attn = self.self_attn
        h = self.input_layernorm(x)

        def heads(p: nn.Module) -> torch.Tensor:
            return p(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)

        q, k, v = heads(attn.q_proj), heads(attn.k_proj), heads(attn.v_proj)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        if cache is not None:
            if cache:
                k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
            cache[:] = [k, v]
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal and t > 1)
        x = x + attn.o_proj(out.transpose(1, 2).reshape(b, t, -1))
        h = self.post_attention_layernorm(x)
        return x + self.mlp.down_proj(F.silu(self.mlp.gate_proj(h)) * self.mlp.up_proj(h))


class LocalTransformer(nn.Module):
    """A Qwen2 stack without embeddings: [B, T, H] rows in, [B, T, H] normed rows out."""

    def __init__(self, c: LocalConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Layer(c) for _ in range(c.num_layers))
        self.norm = _RMSNorm(c.hidden_size, c.rms_norm_eps)
        d = c.head_dim
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def new_cache(self) -> list[list[torch.Tensor]]:
        """An empty cache (one [k, v] per layer), for `forward(..., cache=)`."""
        return [[] for _ in self.layers]

    def forward(
        self,
        x: torch.Tensor,
        start: int = 0,
        cache: list[list[torch.Tensor]] | None = None,
        causal: bool = True,
    ) -> torch.Tensor:
        """Rows at positions `start, start + 1, ...`; with `cache` (from `new_cache`) the
        earlier rows' keys and values are read and these rows' appended."""
        t = x.shape[1]
        positions = torch.arange(start, start + t, device=x.device, dtype=torch.float32)
        freqs = torch.outer(positions, self.inv_freq.to(x.device).float())
        angles = torch.cat([freqs, freqs], dim=-1)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, None if cache is None else cache[i], causal)
        return self.norm(x)
