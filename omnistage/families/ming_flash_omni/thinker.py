"""Ming-flash-omni-2.0's thinker: the Bailing-MoE-V2 decoder (`BailingMoeV2ForCausalLM`),
on our hot path.

Read from the reference `modeling_bailing_moe_v2.py` (inclusionAI/Ming, commit 480df09);
what it shares with v1's Bailing-MoE (`ming_omni/thinker.py`: the fused
`query_key_value`, `dense`, `word_embeddings`, pre-norm RMSNorm layers, dense layers
before `first_k_dense_replace`, shared experts added unscaled) is v1's code. New here:

- attention: q and k RMS-normed per head (`q_norm`, `k_norm`, always, whatever
  `use_qk_norm` says), then rotated on their first `head_dim * partial_rotary_factor`
  dims only (neox pairs within those dims; the rest pass through), with
  1 / theta^(2i / rotary_dim) frequencies. The reference's 3-D rotary (`video_rope`,
  `3D`) gives every text position equal (T, H, W) rows, which is this plain partial
  RoPE; an image prompt's [3, T] positions rotate as `rope.py` says;
- router (`BailingV2Gate`, float32 or the model's float64): scores = sigmoid(x W^T);
  the experts are split into `n_group` groups, each group scored by the sum of its two
  best `scores + expert_bias`; the `topk_group` best groups are kept and the
  `num_experts_per_tok` best biased scores among their experts picked; the picked
  experts' weights are their unbiased scores, renormalized (sum + 1e-20) when more than
  one is picked, times `routed_scaling_factor`;
- `router_type: MultiRouter` checkpoints also carry `image_gate` and `audio_gate`
  routers: positions whose `token_modality` is IMAGE (AUDIO) route through them, every
  other position through `gate` (the reference's masks are the `<imagePatch>` /
  `<audioPatch>` positions themselves, not v1's span; `topN` routes everything by `gate`);
- no `norm_head` (the V2 reference never normalizes `lm_head`).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.llama.model import DecoderMLP
from omnistage.families.ming_flash_omni.rope import video_rope_rows
from omnistage.families.ming_omni.thinker import AUDIO, IMAGE, BailingMoeForCausalLM
from omnistage.families.qwen_moe.model import SparseMoeBlock
from omnistage.layers.forward_context import get_forward_context
from omnistage.layers.rotary import RotaryEmbedding, rotate

_QK_NORMS = re.compile(r"\.attention\.(q_norm|k_norm|query_layernorm|key_layernorm)\.")
_QK_NAMES = {"query_layernorm": "q_norm", "key_layernorm": "k_norm"}


class _PartialRope:
    """Frequencies over the rotary dims only: 1 / theta^(2i / rotary_dim) (transformers'
    default rope init with `partial_rotary_factor`, which the reference calls)."""

    attention_scaling = 1.0

    def __init__(self, config: Any) -> None:
        dim = config.rotary_dim
        self.inv_freq = 1.0 / (float(config.rope_theta) ** (torch.arange(0, dim, 2).float() / dim))


class PartialRotary(nn.Module):
    """`RotaryEmbedding` over the first `rotary_dim` dims of each head; the rest pass."""

    def __init__(self, table: RotaryEmbedding, rotary_dim: int) -> None:
        super().__init__()
        self.table = table
        self.rotary_dim = rotary_dim

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.table.tables(positions)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        d = self.rotary_dim
        q = torch.cat((rotate(q[..., :d], cos, sin), q[..., d:]), dim=-1)
        k = torch.cat((rotate(k[..., :d], cos, sin), k[..., d:]), dim=-1)
        return q, k


class BailingV2Gate(nn.Module):
    """The grouped sigmoid router with expert bias (see the module docstring)."""

    def __init__(self, config: Any, dtype: torch.dtype) -> None:
        super().__init__()
        e = config.num_experts
        self.weight = nn.Parameter(torch.empty(e, config.hidden_size, dtype=dtype), False)
        self.expert_bias = nn.Parameter(torch.zeros(e, dtype=dtype), requires_grad=False)
        self.n_group, self.topk_group = config.n_group, config.topk_group
        self.top_k = config.num_experts_per_tok
        self.scale = float(config.routed_scaling_factor)
        self.compute_dtype = torch.float64 if dtype == torch.float64 else torch.float32

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, top_k] in the compute dtype, experts [T, top_k] int64) of x [T, H]."""
        dt = self.compute_dtype
        scores = torch.sigmoid(F.linear(x.to(dt), self.weight.to(dt)))
        biased = scores + self.expert_bias.to(dt)
        t = biased.shape[0]
        group_scores = biased.view(t, self.n_group, -1).topk(2, dim=-1)[0].sum(dim=-1)
        groups = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, groups, True)
        keep = keep.unsqueeze(-1).expand(t, self.n_group, biased.shape[1] // self.n_group)
        masked = biased.masked_fill(~keep.reshape(t, -1), float("-inf"))
        experts = torch.topk(masked, k=self.top_k, dim=-1, sorted=False)[1]
        weights = torch.gather(scores, 1, experts)
        if self.top_k > 1:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * self.scale, experts


class BailingV2SparseMoe(SparseMoeBlock):
    """Routed experts (stacked, `SparseMoeBlock`'s storage and expert loop) picked by
    `BailingV2Gate`, plus the unscaled shared experts."""

    def __init__(self, config: Any, dtype: torch.dtype) -> None:
        routed = copy.copy(config)
        routed.shared_expert_intermediate_size = 0
        routed.norm_topk_prob = True
        super().__init__(routed, dtype)
        self.gate = BailingV2Gate(config, dtype)
        if config.router_type == "MultiRouter":
            self.image_gate = BailingV2Gate(config, dtype)
            self.audio_gate = BailingV2Gate(config, dtype)
        shared = (config.num_shared_experts or 0) * config.moe_intermediate_size
        self.shared_experts = DecoderMLP(config, dtype, shared) if shared else None

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        weights, experts = self.gate(x)
        kinds = get_forward_context().token_modality if hasattr(self, "image_gate") else None
        if kinds is not None:
            for code, gate in ((IMAGE, self.image_gate), (AUDIO, self.audio_gate)):
                rows = (kinds == code).nonzero().flatten()
                if len(rows):
                    weights[rows], experts[rows] = gate(x[rows])
        out = self.routed(x, weights.to(x.dtype), experts)
        if self.shared_experts is not None:
            out.add_(self.shared_experts.without_residual(x))
        # (routed + shared) + residual, the reference's order of additions.
        return out.add_(residual)


class BailingMoeV2ForCausalLM(BailingMoeForCausalLM):
    """The Bailing-MoE-V2 decoder of `llm_config` (see the module docstring)."""

    architectures = ("OmnistageMingFlashThinker",)
    qk_norm = True
    supports_mrope = True  # image prompts' 3-D positions (`rope.py`)

    def __init__(self, config: Any, dtype: torch.dtype, max_positions: int) -> None:
        super().__init__(config, dtype, max_positions)
        self.norm_head = False
        table = self.layers[0].self_attn.rotary
        table.enable_position_rows(video_rope_rows(config))  # image prompts: `rope.py`
        rotary = PartialRotary(table, config.rotary_dim)
        for layer in self.layers:
            layer.self_attn.rotary = rotary

    @classmethod
    def _rotary_frequencies(cls, config: Any) -> Any:
        return _PartialRope(config)

    def make_mlp(self, config: Any, layer_idx: int, dtype: torch.dtype) -> nn.Module | None:
        sparse = bool(config.num_experts) and layer_idx >= config.first_k_dense_replace
        return BailingV2SparseMoe(config, dtype) if sparse else None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        def renamed() -> Iterable[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                name = _QK_NORMS.sub(
                    lambda m: f".self_attn.{_QK_NAMES.get(m.group(1), m.group(1))}.", name
                )
                yield name, tensor

        return super().load_weights(renamed())
