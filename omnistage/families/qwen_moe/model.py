"""Qwen3-MoE and Qwen2-MoE: decoders with sparse mixture-of-experts feed-forward blocks.

Each token's router picks `num_experts_per_tok` of `num_experts` SwiGLU experts
(softmax over all experts in float32, top-k, renormalized when
`norm_topk_prob`), and the block returns their weighted sum — as
transformers' `Qwen3MoeSparseMoeBlock` does. Qwen2-MoE (and the Qwen3-Omni
talker) add a shared expert that every token goes through, scaled by a sigmoid
gate (`shared_expert_intermediate_size`). Layers listed in
`mlp_only_layers`, or off the `decoder_sparse_step` grid, keep a dense MLP.
Expert weights are stored stacked per layer ([experts, 2 * moe_intermediate,
hidden] for gate and up, [experts, hidden, moe_intermediate] for down) and
load from the per-expert names of the released checkpoints
(`mlp.experts.{e}.gate_proj.weight`, ...) or from stacked ones.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.llama.model import DecoderMLP, Qwen2ForCausalLM, Qwen3ForCausalLM
from omnistage.layers.linear import Linear

_EXPERT = re.compile(
    r"^(?:model\.)?(layers\.\d+\.mlp)\.experts\.(\d+)\.(gate|up|down)_proj\.weight$"
)
_STACKED = re.compile(r"^(?:model\.)?(layers\.\d+\.mlp)\.experts\.(gate_up|down)_proj$")


class SparseMoeBlock(nn.Module):
    def __init__(self, config: Any, dtype: torch.dtype) -> None:
        super().__init__()
        self.num_experts = config.num_experts
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        self.intermediate = config.moe_intermediate_size
        hidden = config.hidden_size
        self.gate = Linear(hidden, self.num_experts, False, dtype)
        self.w_gate_up = nn.Parameter(
            torch.empty(self.num_experts, 2 * self.intermediate, hidden, dtype=dtype),
            requires_grad=False,
        )
        self.w_down = nn.Parameter(
            torch.empty(self.num_experts, hidden, self.intermediate, dtype=dtype),
            requires_grad=False,
        )
        shared = getattr(config, "shared_expert_intermediate_size", 0) or 0
        self.shared_expert = DecoderMLP(config, dtype, shared) if shared else None
        self.shared_expert_gate = Linear(hidden, 1, False, dtype) if shared else None

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        weights, experts = self.route(self.gate, x)
        return self.mix(x, weights, experts, residual)

    def route(self, gate: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The router `gate`'s top-k experts of each row of `x` and their float32 weights
        (softmax in float32, renormalized when `norm_topk_prob`)."""
        probs = F.softmax(gate(x), dim=-1, dtype=torch.float32)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights /= weights.sum(dim=-1, keepdim=True)
        return weights, experts

    def mix(
        self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, residual: torch.Tensor
    ) -> torch.Tensor:
        """The routed experts' weighted sum over each row of `x` (plus the gated shared
        expert) added to `residual`."""
        out = self.routed(x, weights.to(x.dtype), experts)
        if self.shared_expert is not None:
            gate = torch.sigmoid(self.shared_expert_gate(x))
            out.add_(gate * self.shared_expert.without_residual(x))
        return out.add_(residual)

    def routed(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """sum over slots of weights[t, s] * expert experts[t, s](x[t]): [T, hidden], from
        `weights` [T, top_k] (x's dtype) and `experts` [T, top_k] (int64)."""
        out = torch.zeros_like(x)
        # Group the (token, slot) pairs by expert once, then one GEMM pair per expert hit.
        flat = experts.flatten()
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        tokens = order // self.top_k
        start = 0
        for expert, n in enumerate(counts):
            if n == 0:
                continue
            idx = tokens[start : start + n]
            slot = order[start : start + n] % self.top_k
            gate, up = F.linear(x[idx], self.w_gate_up[expert]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.w_down[expert])
            out.index_add_(0, idx, y * weights[idx, slot, None])
            start += n
        return out

    def load_expert(self, expert: int, part: str, tensor: torch.Tensor) -> None:
        i = self.intermediate
        if part == "gate":
            self.w_gate_up[expert, :i].copy_(tensor)
        elif part == "up":
            self.w_gate_up[expert, i:].copy_(tensor)
        else:
            self.w_down[expert].copy_(tensor)


class _MoeMixin:
    """Sparse layers and expert weight loading, shared by the MoE decoders."""

    dtype: torch.dtype

    def make_mlp(self, config: Any, layer_idx: int, dtype: torch.dtype) -> nn.Module | None:
        sparse = (
            layer_idx not in (getattr(config, "mlp_only_layers", None) or [])
            and config.num_experts > 0
            and (layer_idx + 1) % config.decoder_sparse_step == 0
        )
        return SparseMoeBlock(config, dtype) if sparse else None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loaded: set[str] = set()
        modules = dict(self.named_modules())

        def dense(items: Iterable[tuple[str, torch.Tensor]]) -> Iterable[tuple[str, torch.Tensor]]:
            for name, tensor in items:
                if m := _EXPERT.match(name):
                    block, expert, part = m.group(1), int(m.group(2)), m.group(3)
                    modules[block].load_expert(expert, part, tensor.to(self.dtype))
                    loaded.add(f"{block}.experts.{expert}.{part}")
                elif m := _STACKED.match(name):
                    block, part = m.group(1), m.group(2)
                    target = (
                        modules[block].w_gate_up if part == "gate_up" else modules[block].w_down
                    )
                    target.copy_(tensor.to(self.dtype))
                    for e in range(target.shape[0]):
                        parts = ("gate", "up") if part == "gate_up" else ("down",)
                        loaded.update(f"{block}.experts.{e}.{p}" for p in parts)
                else:
                    yield name, tensor

        return super().load_weights(dense(weights)) | loaded

    def expected_weight_names(self) -> set[str]:
        names = {
            n
            for n in super().expected_weight_names()
            if not (n.endswith(".w_gate_up") or n.endswith(".w_down"))
        }
        for name, module in self.named_modules():
            if isinstance(module, SparseMoeBlock):
                block = name.removeprefix("model.")
                names.update(
                    f"{block}.experts.{e}.{p}"
                    for e in range(module.num_experts)
                    for p in ("gate", "up", "down")
                )
        return names


class Qwen3MoeForCausalLM(_MoeMixin, Qwen3ForCausalLM):
    architectures = ("Qwen3MoeForCausalLM",)


class Qwen2MoeForCausalLM(_MoeMixin, Qwen2ForCausalLM):
    architectures = ("Qwen2MoeForCausalLM",)

    @staticmethod
    def _hf_rotary(config: Any) -> nn.Module:
        from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeRotaryEmbedding

        return Qwen2MoeRotaryEmbedding(config)


class Qwen3OmniTalkerDecoder(Qwen3MoeForCausalLM):
    """The decoder of Qwen3-Omni's talker: every layer MoE plus a gated shared expert
    (the reference ignores `mlp_only_layers` there); its input embedding is the codec
    embedding and its head the codec head (`models/parts.py` maps the names). What the
    talker is fed (projected thinker states, codec embeddings) is assembled outside it."""

    architectures = ()  # the base of `qwen3_omni_talker.Qwen3OmniTalker`

    def make_mlp(self, config: Any, layer_idx: int, dtype: torch.dtype) -> nn.Module | None:
        return SparseMoeBlock(config, dtype)
