"""CosyVoice3's flow-matching estimator: the DiT that predicts the velocity field.

A port of the reference `cosyvoice.flow.DiT.dit.DiT` (an F5-TTS DiT) as the CosyVoice3
flow uses it (no long skip connection, no text/ConvNeXt branch). One call maps the noisy
mel `x`, the speech-token features `mu`, the prompt-mel condition `cond`, the projected
speaker vector `spks` and the flow time `t` to a velocity, all time-major `[B, N, C]`:

    t ──sin/cos──MLP──────────────┐ (AdaLN-Zero modulation of every block)
    [x | cond | mu | spks] ─proj─+causal conv pos─ DiTBlock x depth ─AdaLN─ proj_out ─> v

Module and parameter names equal the reference's, so the `decoder.estimator.*` tensors
of CosyVoice3's `flow.pt` (including the persistent `rotary_embed.inv_freq` buffer)
load as they are. This module owns the estimator network, the static chunk mask its
streaming mode attends with and the per-row attention of a padded batch (`RowMasks`);
the Euler solver that calls it lives in `flow.py`.

Two reference behaviours kept on purpose (the weights were trained with them):
- RoPE (x_transformers' `apply_rotary_pos_emb`, interleaved pairs) is applied to the
  flat `[B, N, heads * dim_head]` projections before the head split, so only the first
  `dim_head` channels (head 0) are rotated; the other heads see no positions.
- The timestep's sinusoid frequencies are computed in float32 and then promoted, so a
  float64 module reproduces a float64 reference bit for bit up to summation order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

FREQ_EMBED_DIM = 256  # the timestep sinusoid width (reference TimestepEmbedding default)
CONV_POS_KERNEL = 31
CONV_POS_GROUPS = 16
NORM_EPS = 1e-6


def rope_inv_freq(dim_head: int, base: float = 10000.0) -> torch.Tensor:
    """x_transformers' `RotaryEmbedding.inv_freq` (float32, `dim_head // 2` values)."""
    return 1.0 / (base ** (torch.arange(0, dim_head, 2, device="cpu").float() / dim_head))


def chunk_mask(length: int, chunk_size: int, device: torch.device) -> torch.Tensor:
    """`[length, length]` bool: frame `i` attends to every frame before the end of its
    `chunk_size` chunk (the reference's `subsequent_chunk_mask`, all left chunks)."""
    pos = torch.arange(length, device=device)
    chunk_end = (torch.div(pos, chunk_size, rounding_mode="trunc") + 1) * chunk_size
    return pos.unsqueeze(0) < chunk_end.unsqueeze(1)


@dataclass(frozen=True)
class RowMasks:
    """The attention of a right-padded batch whose rows differ (`flow_batch`): row b
    attends among its first `lengths[b]` frames only, with `masks[b]` (`[n, n]` bool, or
    None: all of them), exactly as that row alone would (its own SDPA call on its own
    frames: masking padded keys in one batched call changes the softmax's and the value
    product's summation order in float32). Padded frames' outputs are zero."""

    lengths: tuple[int, ...]
    masks: tuple[torch.Tensor | None, ...]

    def repeated(self, times: int) -> RowMasks:
        """The masks of the batch stacked `times` over itself (classifier-free guidance)."""
        return RowMasks(self.lengths * times, self.masks * times)


AttentionMask = torch.Tensor | RowMasks | None
"""`[N, N]` bool for every row (True: may attend), per-row `RowMasks`, or None (full)."""


def _layer_norm(x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), eps=NORM_EPS)


class TimestepEmbedding(nn.Module):
    """Flow time `t [B]` -> `[B, dim]`: sin/cos at scale 1000, then Linear-SiLU-Linear."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.time_mlp = nn.Sequential(
            nn.Linear(FREQ_EMBED_DIM, dim), nn.SiLU(), nn.Linear(dim, dim)
        )

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = FREQ_EMBED_DIM // 2
        step = math.log(10000) / (half - 1)
        # float32 like the reference; the product below promotes to t's dtype
        freqs = torch.exp(torch.arange(half, device=t.device).float() * -step)
        angles = 1000 * t.unsqueeze(1) * freqs.unsqueeze(0)
        hidden = torch.cat((angles.sin(), angles.cos()), dim=-1).to(t.dtype)
        return self.time_mlp(hidden)


class CausalConvPositionEmbedding(nn.Module):
    """Two left-padded grouped convs (kernel 31, 16 groups), each followed by Mish."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv1 = nn.Sequential(
            nn.Conv1d(dim, dim, CONV_POS_KERNEL, groups=CONV_POS_GROUPS), nn.Mish()
        )
        self.conv2 = nn.Sequential(
            nn.Conv1d(dim, dim, CONV_POS_KERNEL, groups=CONV_POS_GROUPS), nn.Mish()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.transpose(1, 2)
        y = self.conv1(F.pad(y, (CONV_POS_KERNEL - 1, 0)))
        y = self.conv2(F.pad(y, (CONV_POS_KERNEL - 1, 0)))
        return y.transpose(1, 2)


class InputEmbedding(nn.Module):
    """`[x | cond | mu | spks]` -> dim, plus the causal conv position embedding of that."""

    def __init__(self, mel_dim: int, mu_dim: int, spk_dim: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(mel_dim * 2 + mu_dim + spk_dim, dim)
        self.conv_pos_embed = CausalConvPositionEmbedding(dim)

    def forward(
        self, x: torch.Tensor, cond: torch.Tensor, mu: torch.Tensor, spks: torch.Tensor
    ) -> torch.Tensor:
        spks = spks.unsqueeze(1).expand(-1, x.shape[1], -1)
        h = self.proj(torch.cat((x, cond, mu, spks), dim=-1))
        return self.conv_pos_embed(h) + h


class RotaryEmbedding(nn.Module):
    """x_transformers' RotaryEmbedding as the DiT calls it (no xpos, no interpolation)."""

    def __init__(self, dim_head: int) -> None:
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(dim_head))

    def forward(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin, `[length, dim_head]`, each frequency repeated for its pair."""
        # the angle in inv_freq's dtype as the reference does, but never below float32
        dtype = torch.promote_types(self.inv_freq.dtype, torch.float32)
        pos = torch.arange(length, device=self.inv_freq.device).to(dtype)
        freqs = pos.unsqueeze(1) * self.inv_freq.to(dtype).unsqueeze(0)
        freqs = freqs.repeat_interleave(2, dim=-1)
        return freqs.cos(), freqs.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first `cos.shape[-1]` channels of `x [B, N, C]` in interleaved pairs
    ((a, b) -> (a cos - b sin, b cos + a sin)); the rest pass through."""
    rot = cos.shape[-1]
    head, rest = x[..., :rot], x[..., rot:]
    pairs = head.unflatten(-1, (rot // 2, 2))
    half_turn = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    rotated = head * cos.to(x.dtype) + half_turn * sin.to(x.dtype)
    return torch.cat((rotated, rest), dim=-1)


class Attention(nn.Module):
    """Multi-head self-attention with RoPE on the flat projections (see module doc)."""

    def __init__(self, dim: int, heads: int, dim_head: int) -> None:
        super().__init__()
        self.heads = heads
        inner = heads * dim_head
        self.to_q = nn.Linear(dim, inner)
        self.to_k = nn.Linear(dim, inner)
        self.to_v = nn.Linear(dim, inner)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim)])  # [1] was a Dropout

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: AttentionMask
    ) -> torch.Tensor:
        batch, length, _ = x.shape
        q = apply_rope(self.to_q(x), *rope)
        k = apply_rope(self.to_k(x), *rope)
        v = self.to_v(x)
        q, k, v = (y.view(batch, length, self.heads, -1).transpose(1, 2) for y in (q, k, v))
        if isinstance(mask, RowMasks):
            out = torch.zeros_like(q)
            for row, (n, row_mask) in enumerate(zip(mask.lengths, mask.masks, strict=True)):
                own = (y[row : row + 1, :, :n] for y in (q, k, v))
                out[row : row + 1, :, :n] = F.scaled_dot_product_attention(*own, attn_mask=row_mask)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        # the reference then zeroes rows whose last mask row is False: never the case
        # for a real frame here (a row's last real frame sees all its real frames); the
        # padded frames of a batch (`RowMasks`) are zero and dropped by the caller
        return self.to_out[0](out.transpose(1, 2).reshape(batch, length, -1))


class FeedForward(nn.Module):
    """Linear -> GELU (tanh) -> Linear; indices kept as the reference's `ff.ff.{0.0,2}`."""

    def __init__(self, dim: int, mult: int) -> None:
        super().__init__()
        inner = dim * mult
        self.ff = nn.Sequential(
            nn.Sequential(nn.Linear(dim, inner), nn.GELU(approximate="tanh")),
            nn.Identity(),  # the reference's Dropout
            nn.Linear(inner, dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ff(x)


class AdaLayerNormZero(nn.Module):
    """`Linear(SiLU(t))` -> 6 modulations (shift/scale/gate for attention, then MLP)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim * 6)

    def forward(self, t: torch.Tensor, rows: int) -> tuple[torch.Tensor, ...]:
        """Each `[T * rows, 1, dim]`: time row i modulates the `rows` rows after i * rows."""
        out = self.linear(F.silu(t)).repeat_interleave(rows, dim=0)
        return tuple(m.unsqueeze(1) for m in out.chunk(6, dim=1))


class AdaLayerNormZeroFinal(nn.Module):
    """The output norm: `LN(x) * (1 + scale) + shift` (scale first in the linear's output)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim * 2)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0] // t.shape[0]
        scale, shift = self.linear(F.silu(t)).repeat_interleave(rows, dim=0).chunk(2, dim=1)
        return _layer_norm(x) * (1 + scale)[:, None, :] + shift[:, None, :]


class DiTBlock(nn.Module):
    """AdaLN-Zero pre-norm attention and feed-forward, each gated by the time embedding."""

    def __init__(self, dim: int, heads: int, dim_head: int, ff_mult: int) -> None:
        super().__init__()
        self.attn_norm = AdaLayerNormZero(dim)
        self.attn = Attention(dim, heads, dim_head)
        self.ff = FeedForward(dim, ff_mult)

    def forward(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        mask: AttentionMask,
    ) -> torch.Tensor:
        modulations = self.attn_norm(t, x.shape[0] // t.shape[0])
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = modulations
        norm = _layer_norm(x) * (1 + scale_msa) + shift_msa
        x = x + gate_msa * self.attn(norm, rope, mask)
        norm = _layer_norm(x) * (1 + scale_mlp) + shift_mlp
        return x + gate_mlp * self.ff(norm)


class DiT(nn.Module):
    """The estimator: `(x, cond, mu, spks, t, mask) -> velocity`, time-major."""

    def __init__(
        self,
        *,
        dim: int,
        depth: int,
        heads: int,
        dim_head: int,
        ff_mult: int,
        mel_dim: int,
        mu_dim: int,
        spk_dim: int,
    ) -> None:
        super().__init__()
        self.time_embed = TimestepEmbedding(dim)
        self.input_embed = InputEmbedding(mel_dim, mu_dim, spk_dim, dim)
        self.rotary_embed = RotaryEmbedding(dim_head)
        self.transformer_blocks = nn.ModuleList(
            DiTBlock(dim, heads, dim_head, ff_mult) for _ in range(depth)
        )
        self.norm_out = AdaLayerNormZeroFinal(dim)
        self.proj_out = nn.Linear(dim, mel_dim)

    def forward(
        self,
        x: torch.Tensor,
        cond: torch.Tensor,
        mu: torch.Tensor,
        spks: torch.Tensor,
        t: torch.Tensor,
        mask: AttentionMask,
    ) -> torch.Tensor:
        """x, cond `[B, N, mel_dim]`, mu `[B, N, mu_dim]`, spks `[B, spk_dim]`.

        t `[T]`, B a multiple of T: time i is the time of the B / T rows from i * B / T
        on. The time embedding and its modulations are computed on the T rows and then
        repeated (a linear layer's rows can round differently with the batch's shape;
        so a batch's rows get exactly the bits of one item's).
        mask: `[N, N]` bool for every row (True: may attend), `RowMasks` per row of a
        padded batch, or None for full attention.
        Returns the velocity `[B, N, mel_dim]`."""
        t_emb = self.time_embed(t)
        h = self.input_embed(x, cond, mu, spks)
        rope = self.rotary_embed(h.shape[1])
        for block in self.transformer_blocks:
            h = block(h, t_emb, rope, mask)
        return self.proj_out(self.norm_out(h, t_emb))
