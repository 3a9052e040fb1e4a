"""The LLaDA backbone of Dynin-Omni: a bidirectional Llama-style transformer, in LLaDA's
parameter names (`model.transformer.wte`, `model.transformer.blocks.N.q_proj`, …,
`model.transformer.ln_f`, `model.transformer.ff_out`).

It is no autoregressive model: every position attends to every other (no causal mask,
no KV cache), and `forward` maps a whole sequence, masks included, to logits for every
position. The masked-diffusion loop that calls it lives in `unmask.py`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.dynin_omni.config import DyninOmniConfig


class RMSLayerNorm(nn.Module):
    """LLaDA's `RMSLayerNorm`: normalised in float32, scaled by a weight."""

    def __init__(self, size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        og_dtype = x.dtype
        h = x.to(torch.promote_types(x.dtype, torch.float32))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(og_dtype)


def rotary(seq_len: int, dim: int, theta: float, device: torch.device) -> tuple:
    """LLaDA's RoPE tables (halves rotated, not interleaved), in float32 or better."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device=device, dtype=torch.float) / dim))
    freqs = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float), inv_freq)
    pos = torch.cat((freqs, freqs), dim=-1)
    return pos.sin(), pos.cos()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    work = torch.promote_types(x.dtype, torch.float32)
    h = x.to(work)
    return (h * cos.to(work) + _rotate_half(h) * sin.to(work)).to(x.dtype)


class LLaDALlamaBlock(nn.Module):
    """`x + attn(norm(x))`, then `x + ff_out(silu(ff_proj(h)) * up_proj(h))`."""

    def __init__(self, cfg: DyninOmniConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.cfg = cfg
        d, hd, qkv_bias = cfg.d_model, cfg.head_dim, cfg.include_bias or cfg.include_qkv_bias
        self.attn_norm = RMSLayerNorm(d, cfg.rms_norm_eps, dtype)
        self.ff_norm = RMSLayerNorm(d, cfg.rms_norm_eps, dtype)
        self.q_proj = nn.Linear(d, d, bias=qkv_bias, dtype=dtype)
        self.k_proj = nn.Linear(d, cfg.kv_heads * hd, bias=qkv_bias, dtype=dtype)
        self.v_proj = nn.Linear(d, cfg.kv_heads * hd, bias=qkv_bias, dtype=dtype)
        self.attn_out = nn.Linear(d, d, bias=cfg.include_bias, dtype=dtype)
        self.ff_proj = nn.Linear(d, cfg.ff_size, bias=cfg.include_bias, dtype=dtype)
        self.up_proj = nn.Linear(d, cfg.ff_size, bias=cfg.include_bias, dtype=dtype)
        self.ff_out = nn.Linear(cfg.ff_size, d, bias=cfg.include_bias, dtype=dtype)

    def forward(
        self, x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        b, t, _ = x.shape
        cfg = self.cfg
        h = self.attn_norm(x)
        q = self.q_proj(h).view(b, t, cfg.n_heads, cfg.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, t, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, t, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, sin, cos), apply_rotary(k, sin, cos)
        if cfg.kv_heads != cfg.n_heads:
            rep = cfg.n_heads // cfg.kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        mask = None if bias is None else bias.to(k.dtype)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False)
        x = x + self.attn_out(att.transpose(1, 2).reshape(b, t, cfg.d_model))
        h = self.ff_norm(x)
        return x + self.ff_out(F.silu(self.ff_proj(h)) * self.up_proj(h))


class _Transformer(nn.Module):
    def __init__(self, cfg: DyninOmniConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.table_size, cfg.d_model, dtype=dtype)
        self.blocks = nn.ModuleList(LLaDALlamaBlock(cfg, dtype) for _ in range(cfg.n_layers))
        self.ln_f = RMSLayerNorm(cfg.d_model, cfg.rms_norm_eps, dtype)
        if not cfg.weight_tying:
            self.ff_out = nn.Linear(cfg.d_model, cfg.table_size, bias=cfg.include_bias, dtype=dtype)


class _LLaDAModel(nn.Module):
    def __init__(self, cfg: DyninOmniConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.transformer = _Transformer(cfg, dtype)


class LLaDAModelLM(nn.Module):
    """Dynin's `DyninOmniModelLM` weights (`model.transformer.*`): ids -> logits."""

    def __init__(self, cfg: DyninOmniConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = _LLaDAModel(cfg, dtype)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`[batch, seq]` ids -> `[batch, seq, table_size]` logits (full attention). With an
        `attention_mask` ([batch, seq], 0 = padding), a query/key pair is attended only where
        both are kept: LLaDA's bool `attention_bias`, as float32 with its minimum elsewhere."""
        tr = self.model.transformer
        x = tr.wte(input_ids)
        sin, cos = rotary(input_ids.shape[1], self.cfg.head_dim, self.cfg.rope_theta, x.device)
        bias = None
        if attention_mask is not None:
            keep = attention_mask.bool()
            bias = (keep[:, :, None] & keep[:, None, :]).unsqueeze(1).to(torch.float)
            bias.masked_fill_(bias == 0.0, torch.finfo(bias.dtype).min)
        for block in tr.blocks:
            x = block(x, sin, cos, bias)
        x = tr.ln_f(x)
        logits = F.linear(x, tr.wte.weight) if self.cfg.weight_tying else tr.ff_out(x)
        if self.cfg.scale_logits:
            logits = logits * (1.0 / self.cfg.d_model**0.5)
        return logits
