"""The talker's two small transformers over audio latents: the flow-matching head's
velocity network (`DiT`) and the `Aggregator` that turns a generated latent patch back into
one input embedding of the talker's LM.

Read from the reference `fm/dit.py` and `fm/modules.py` (inclusionAI/Ming-omni-tts, the
talker of Ming-flash-omni-2.0), parameter names kept:

- a block (`DiTBlock`): x + attn(rms1(x)), then x + ff(rms2(x)); RMSNorm eps 1e-6;
  attention `to_q` / `to_k` / `to_v` / `to_out.0` (biased), bidirectional, RoPE over the
  whole head with x-transformers' layout (adjacent dims pair up: (2i, 2i + 1) rotate by
  inv_freq[i] = 10000^(-2i / head_dim), positions 0..n-1); feed-forward `ff.0.0`, tanh
  GELU, `ff.2`;
- `DiT(x, t, c, history)`: the sequence is [t_emb(t) + c_emb(c), x_emb(history), x_emb(x)]
  and the result is `final_layer` over every position (the caller keeps the last
  `patch` ones); t_emb is a 256-dim sinusoid of 1000 t (sin half, then cos half) through
  `time_mlp` (Linear, SiLU, Linear);
- `Aggregator(patch)`: [word_embedder(0), x_emb(patch)] through the blocks, `final_layer`
  to the LM's hidden size, the first position kept.

Both run once per talker step on a few positions; they are plain torch modules (the
DESIGN's rule for once-per-step parts), not on the paged-KV path.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class _RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, 1e-6)


def interleaved_rope(n: int, head_dim: int, device: torch.device) -> torch.Tensor:
    """[n, head_dim] angles: position p, dims 2i and 2i + 1 at p * 10000^(-2i / head_dim)."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    angles = torch.outer(torch.arange(n, device=device).float(), inv_freq)
    return angles.repeat_interleave(2, dim=-1)


def _rotate(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    pairs = x.unflatten(-1, (-1, 2))
    rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    return (x * angles.cos() + rotated * angles.sin()).to(x.dtype)


class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(dim, dim)
        self.to_k = nn.Linear(dim, dim)
        self.to_v = nn.Linear(dim, dim)
        self.to_out = nn.ModuleList([nn.Linear(dim, dim)])

    def forward(self, x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, n, self.heads, d // self.heads).transpose(1, 2)

        q, k = _rotate(heads(self.to_q(x)), angles), _rotate(heads(self.to_k(x)), angles)
        out = F.scaled_dot_product_attention(q, k, heads(self.to_v(x)))
        return self.to_out[0](out.transpose(1, 2).reshape(b, n, d))


class _FeedForward(nn.Module):
    def __init__(self, dim: int, mult: float) -> None:
        super().__init__()
        inner = int(dim * mult)
        self.ff = nn.Sequential(
            nn.Sequential(nn.Linear(dim, inner), nn.GELU(approximate="tanh")),
            nn.Identity(),  # the reference's dropout
            nn.Linear(inner, dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ff(x)


class Block(nn.Module):
    """The reference's `DiTBlock` (pre-norm attention and feed-forward, no modulation)."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float) -> None:
        super().__init__()
        self.norm1 = _RMSNorm(dim)
        self.attn = _Attention(dim, heads)
        self.norm2 = _RMSNorm(dim)
        self.mlp = _FeedForward(dim, mlp_ratio)

    def forward(self, x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), angles)
        return x + self.mlp(self.norm2(x))


class _FinalLayer(nn.Module):
    def __init__(self, dim: int, out: int) -> None:
        super().__init__()
        self.norm_final = _RMSNorm(dim)
        self.linear = nn.Linear(dim, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.norm_final(x))


class _Stack(nn.Module):
    """Blocks over a sequence with RoPE from position 0."""

    def __init__(self, dim: int, depth: int, heads: int, mlp_ratio: float) -> None:
        super().__init__()
        self.heads = heads
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_ratio) for _ in range(depth))

    def run_blocks(self, x: torch.Tensor) -> torch.Tensor:
        angles = interleaved_rope(x.shape[1], x.shape[2] // self.heads, x.device).to(x.dtype)
        for block in self.blocks:
            x = block(x, angles)
        return x


class _TimeMlp(nn.Module):
    def __init__(self, dim: int, freq_dim: int = 256) -> None:
        super().__init__()
        self.freq_dim = freq_dim
        self.time_mlp = nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.freq_dim // 2
        freqs = torch.exp(
            torch.arange(half, device=t.device).float() * -(math.log(10000) / (half - 1))
        )
        angles = 1000 * t.unsqueeze(1) * freqs.unsqueeze(0)
        return self.time_mlp(torch.cat((angles.sin(), angles.cos()), dim=-1).to(t.dtype))


class _CondEmbedder(nn.Module):
    def __init__(self, cond_dim: int, dim: int) -> None:
        super().__init__()
        self.cond_embedder = nn.Linear(cond_dim, dim)

    def forward(self, c: torch.Tensor) -> torch.Tensor:
        return self.cond_embedder(c)


class DiT(_Stack):
    """The velocity network of the flow-matching head (see the module docstring)."""

    def __init__(
        self,
        in_channels: int,
        llm_cond_dim: int,
        hidden_size: int = 1024,
        depth: int = 28,
        num_heads: int = 16,
        mlp_ratio: float = 4.0,
    ) -> None:
        super().__init__(hidden_size, depth, num_heads, mlp_ratio)
        self.t_embedder = _TimeMlp(hidden_size)
        self.x_embedder = nn.Linear(in_channels, hidden_size)
        self.c_embedder = _CondEmbedder(llm_cond_dim, hidden_size)
        self.final_layer = _FinalLayer(hidden_size, in_channels)

    def forward(
        self, x: torch.Tensor, t: torch.Tensor, c: torch.Tensor, history: torch.Tensor
    ) -> torch.Tensor:
        """x [B, P, C], t [B], c [B, 1, cond], history [B, Hp, C] -> [B, 1 + Hp + P, C]."""
        y = self.t_embedder(t).unsqueeze(1) + self.c_embedder(c)
        seq = torch.cat([y, self.x_embedder(history), self.x_embedder(x)], dim=1)
        return self.final_layer(self.run_blocks(seq))


class Aggregator(_Stack):
    """A latent patch -> one LM input embedding (see the module docstring)."""

    def __init__(
        self,
        in_channels: int,
        llm_input_dim: int,
        hidden_size: int = 1152,
        depth: int = 28,
        num_heads: int = 16,
        mlp_ratio: float = 4.0,
    ) -> None:
        super().__init__(hidden_size, depth, num_heads, mlp_ratio)
        self.word_embedder = nn.Embedding(1, hidden_size)
        self.x_embedder = nn.Linear(in_channels, hidden_size)
        self.final_layer = _FinalLayer(hidden_size, llm_input_dim)

    def forward(self, patch: torch.Tensor) -> torch.Tensor:
        """patch [B, P, C] -> [B, 1, llm_input_dim]."""
        cls = self.word_embedder.weight[:1].expand(patch.shape[0], 1, -1)
        seq = torch.cat([cls, self.x_embedder(patch)], dim=1)
        return self.final_layer(self.run_blocks(seq)[:, :1])
