"""HunyuanImage-3's decoder layer: attention with one grouped qkv projection and RMSNorm
on q and k after the rotation, and a SwiGLU feed-forward, dense or mixture-of-experts.

The parameter names are the checkpoint's (`self_attn.qkv_proj`, `query_layernorm`,
`mlp.gate.wg`, `mlp.experts.{e}.gate_and_up_proj`, `mlp.shared_mlp`, …), so weights
load by name with no renaming. Two layouts differ from Llama's and are kept as stored:

- `qkv_proj` rows are grouped per KV head: for each of the `num_key_value_heads`
  heads, its `heads / kv_heads` query heads, then its key, then its value
  (`HunyuanImage3SDPAAttention.forward` reshapes to [kv_heads, groups + 2, head_dim]).
- `gate_and_up_proj` rows are [x1 | x2] and the feed-forward is `down(x1 * silu(x2))`:
  the activation is on the second half.

Routing follows the reference's `topkgating`: a float32 (or wider) softmax over all
experts, the top `moe_topk`, renormalized over them when `norm_topk_prob` and
`moe_topk > 1`, else scaled by `routed_scaling_factor`; with `use_mixed_mlp_moe` a
shared SwiGLU of `num_shared_expert * moe_intermediate_size` is added ungated.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.hunyuan_image3.config import HunyuanImage3Config, LayerMoe
from omnistage.layers.attention import attend, write_kv
from omnistage.layers.forward_context import get_forward_context
from omnistage.layers.linear import Linear
from omnistage.layers.norm import RMSNorm
from omnistage.layers.rotary import RotaryEmbedding, rotate

KV = tuple[torch.Tensor, torch.Tensor]
"""One layer's keys and values of some rows, [T, kv_heads, head_dim] each."""


@dataclass(frozen=True)
class ImageSpan:
    """A run of image tokens in this step's prefill rows [first, last) of one sequence."""

    first: int
    last: int
    keys: int
    """How many of the sequence's positions the run's rows see: up to the run's end."""
    block_ids: torch.Tensor


class HunyuanAttention(nn.Module):
    def __init__(
        self, config: HunyuanImage3Config, dtype: torch.dtype, rotary: RotaryEmbedding
    ) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.groups = self.num_heads // self.num_kv_heads
        self.head_dim = config.attention_head_dim
        self.scale = self.head_dim**-0.5
        width = self.head_dim * (self.num_heads + 2 * self.num_kv_heads)
        bias = config.attention_bias
        self.qkv_proj = Linear(config.hidden_size, width, bias, dtype)
        self.o_proj = Linear(self.num_heads * self.head_dim, config.hidden_size, bias, dtype)
        self.query_layernorm = self.key_layernorm = None
        if config.use_qk_norm:
            self.query_layernorm = RMSNorm(self.head_dim, config.rms_norm_eps, dtype)
            self.key_layernorm = RMSNorm(self.head_dim, config.rms_norm_eps, dtype)
        self.rotary = rotary
        self.kv_cache: torch.Tensor | None = None
        self.image_spans: list[ImageSpan] = []
        """This step's runs of prompt image tokens, set by the model before each forward."""

    def split_qkv(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[T, width] grouped rows -> q [T, heads, d], k and v [T, kv_heads, d]."""
        grouped = qkv.view(-1, self.num_kv_heads, self.groups + 2, self.head_dim)
        q = grouped[:, :, : self.groups].reshape(-1, self.num_heads, self.head_dim)
        return q, grouped[:, :, self.groups], grouped[:, :, self.groups + 1]

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split_qkv(self.qkv_proj(x))
        q, k = self.rotary(positions, q, k)
        if self.query_layernorm is not None:  # after the rotation, as the reference does
            q, k = self.query_layernorm(q), self.key_layernorm(k)
        k, v = k.contiguous(), v.contiguous()
        meta = get_forward_context()
        write_kv(self.kv_cache, k, v, meta.slot_mapping)
        out = attend(q.contiguous(), k, v, self.kv_cache, meta, self.scale)
        for span in self.image_spans:
            out[span.first : span.last] = self._image_rows(q[span.first : span.last], span)
        return self.o_proj(out.reshape(-1, self.num_heads * self.head_dim))

    def _image_rows(self, q: torch.Tensor, span: ImageSpan) -> torch.Tensor:
        """Rows of one run of image tokens: every key up to the run's end, the run's own
        later ones included (the reference's image-bidirectional mask; the cache already
        holds this step's keys)."""
        cache = self.kv_cache
        _, kv_heads, _, block_size, head_dim = cache.shape
        blocks = span.block_ids[: -(-span.keys // block_size)]
        keys, values = (
            cache[i].index_select(1, blocks).reshape(kv_heads, -1, head_dim)[:, : span.keys]
            for i in (0, 1)
        )
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], keys[None], values[None], scale=self.scale, enable_gqa=True
        )
        return out[0].transpose(0, 1)

    def rotated_qkv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [T, heads, d], k and v [T, kv_heads, d] of x [T, hidden], rotated by cos/sin
        [T, d] (2-D RoPE) and normed: the keys and values a later step may reuse."""
        q, k, v = self.split_qkv(self.qkv_proj(x))
        q, k = rotate(q, cos[:, None], sin[:, None]), rotate(k, cos[:, None], sin[:, None])
        if self.query_layernorm is not None:
            q, k = self.query_layernorm(q), self.key_layernorm(k)
        return q, k, v

    def dense_attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """Queries [Tq, heads, d] over keys/values [Tk, kv_heads, d] with mask [Tq, Tk] bool
        (True: may attend), then `o_proj`."""
        # Query head i reads KV head i // groups, as the reference's `repeat_kv`.
        k, v = (t.repeat_interleave(self.groups, dim=1) for t in (k, v))
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1),
            k.transpose(0, 1),
            v.transpose(0, 1),
            attn_mask=mask,
            scale=self.scale,
        )
        return self.o_proj(out.transpose(0, 1).reshape(-1, self.num_heads * self.head_dim))

    def dense(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        past: KV | None = None,
    ) -> tuple[torch.Tensor, KV]:
        """Rows x [T, hidden] without the paged KV cache (the image head's denoising steps),
        after the rows whose keys and values are `past` ([P, kv_heads, d] each, or None);
        mask [T, P + T]. Returns the output rows and x's own (k, v)."""
        q, k, v = self.rotated_qkv(x, cos, sin)
        keys, values = (
            (k, v) if past is None else (torch.cat([past[0], k]), torch.cat([past[1], v]))
        )
        return self.dense_attend(q, keys, values, mask), (k, v)


class HunyuanMLP(nn.Module):
    """down(x1 * silu(x2)) with [x1 | x2] = gate_and_up_proj(x)."""

    def __init__(self, hidden: int, inner: int, bias: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.gate_and_up_proj = Linear(hidden, 2 * inner, bias, dtype)
        self.down_proj = Linear(inner, hidden, bias, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1, x2 = self.gate_and_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(x1 * F.silu(x2))


class HunyuanTopKGate(nn.Module):
    def __init__(self, config: HunyuanImage3Config, moe: LayerMoe, dtype: torch.dtype) -> None:
        super().__init__()
        self.top_k = moe.top_k
        self.normalize = config.norm_topk_prob and moe.top_k > 1
        self.scaling = config.routed_scaling_factor
        # The reference keeps the router in float32 whatever the model's dtype.
        self.router_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        self.wg = Linear(config.hidden_size, moe.num_experts, False, self.router_dtype)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[T, hidden] -> (weights [T, k] in x's dtype, experts [T, k])."""
        gates = F.softmax(self.wg(x.to(self.router_dtype)), dim=-1)
        top, experts = torch.topk(gates, self.top_k, dim=-1)
        if self.normalize:
            weights = top / top.sum(dim=-1, keepdim=True).clamp(min=torch.finfo(gates.dtype).eps)
        else:
            weights = top * self.scaling
        return weights.to(x.dtype), experts


class HunyuanMoE(nn.Module):
    def __init__(self, config: HunyuanImage3Config, moe: LayerMoe, dtype: torch.dtype) -> None:
        super().__init__()
        hidden, inner, bias = config.hidden_size, moe.intermediate, config.mlp_bias
        self.gate = HunyuanTopKGate(config, moe, dtype)
        self.experts = nn.ModuleList(
            HunyuanMLP(hidden, inner, bias, dtype) for _ in range(moe.num_experts)
        )
        self.shared_mlp = None
        if config.use_mixed_mlp_moe:
            shared = inner * moe.num_shared
            self.shared_mlp = HunyuanMLP(hidden, shared, bias, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = self.gate(x)
        out = torch.zeros_like(x)
        # Each token's rows grouped by expert: one GEMM pair per expert hit. Every token's
        # sum is over its own experts only, so a row's result never depends on the batch.
        for expert in torch.unique(experts).tolist():
            token, slot = (experts == expert).nonzero(as_tuple=True)
            y = self.experts[expert](x[token])
            out.index_add_(0, token, y * weights[token, slot, None])
        if self.shared_mlp is not None:
            out = self.shared_mlp(x) + out
        return out


class HunyuanDecoderLayer(nn.Module):
    def __init__(
        self,
        config: HunyuanImage3Config,
        layer_idx: int,
        dtype: torch.dtype,
        rotary: RotaryEmbedding,
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.self_attn = HunyuanAttention(config, dtype, rotary)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        moe = config.layer_moe(layer_idx)
        if moe is not None:
            self.mlp: nn.Module = HunyuanMoE(config, moe, dtype)
        else:
            hidden, bias = config.hidden_size, config.mlp_bias
            self.mlp = HunyuanMLP(hidden, config.intermediate_size, bias, dtype)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(positions, self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))

    def dense(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        past: KV | None = None,
    ) -> tuple[torch.Tensor, KV]:
        """`forward` of rows without the paged KV cache (`HunyuanAttention.dense`): the
        output rows and the rows' own keys and values."""
        attn, kv = self.self_attn.dense(self.input_layernorm(x), cos, sin, mask, past)
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x)), kv
