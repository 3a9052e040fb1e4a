"""Ming-Omni's thinker: the Bailing-MoE decoder (`BailingMoeForCausalLM`), on our hot path.

Read from the reference `modeling_bailing_moe.py` (inclusionAI/Ming, Ming-omni):

- attention: one fused `query_key_value` projection (q, k, v rows in that order, bias
  `use_qkv_bias`), neox RoPE with `rope_theta` over `head_dim`, output `dense` (bias
  `use_bias`); pre-norm RMSNorm (`input_layernorm`, `post_attention_layernorm`);
- feed-forward: layers from `first_k_dense_replace` on are sparse: a softmax router
  (`gate`, float32) picks `num_experts_per_tok` SwiGLU experts, renormalized when
  `norm_topk_prob`, plus `num_shared_experts` shared experts as one SwiGLU of width
  `moe_intermediate_size * num_shared_experts`, added unscaled (no sigmoid gate);
  earlier layers are a dense SwiGLU of `intermediate_size`;
- `norm_head`: the reference normalizes `lm_head` once, in float32, column-wise
  (`w / (||w||_2 over the vocabulary + 1e-7)`), before its first logits; done here at
  load time.

`multi_gate` checkpoints also carry `image_gate` and `audio_gate` routers: the reference
routes the prompt positions strictly inside an image / audio span through them
(`BailingMoeSparseMoeBlock.forward`, `create_mask`: `start < i < end`), every other
position through `gate` (its text path passes spans of 999999, which select nothing).
Here the spans arrive as the prompt's per-token modality (`token_modalities`: code 1
image, 2 audio; `core/multimodal_inputs.py`), which the runner hands each step through
the forward context, so a chunk of a prompt routes its positions as the whole prompt does.
A checkpoint without `multi_gate` routes every position through `gate` (the reference's
`else` branch), codes or not.

As a pipeline stage (`MingThinker`, part `thinker`) it sends the talker, per computed
position, its input embedding and its final normed hidden state
(`hidden_output_layers = (0, num_layers)`): the reference's talker is conditioned on
`hidden_states[0] + hidden_states[-1]` of the prompt positions.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from omnistage.families.llama.model import DecoderMLP, LlamaForCausalLM
from omnistage.families.qwen_moe.model import SparseMoeBlock, _MoeMixin
from omnistage.layers.forward_context import get_forward_context
from omnistage.layers.linear import Linear

IMAGE, AUDIO = 1, 2
"""The thinker's `token_modality` codes (`BailingMoeForCausalLM.token_modalities`)."""

_RENAMES = (
    (re.compile(r"^(model\.)?word_embeddings\."), r"\1embed_tokens."),
    (re.compile(r"\.attention\.query_key_value\."), ".self_attn.qkv_proj."),
    (re.compile(r"\.attention\.dense\."), ".self_attn.o_proj."),
)


class _BailingRope:
    """The reference's `BailingMoeRotaryEmbedding` frequencies: 1 / theta^(2i / head_dim)."""

    attention_scaling = 1.0

    def __init__(self, config: Any) -> None:
        dim = config.head_dim
        exponent = torch.arange(0, dim, 2).float() / dim
        self.inv_freq = 1.0 / (float(config.rope_theta) ** exponent)


class BailingSparseMoe(SparseMoeBlock):
    """Routed experts (`SparseMoeBlock`) plus the unscaled shared experts; `multi_gate`
    checkpoints route image (audio) positions through `image_gate` (`audio_gate`)."""

    def __init__(self, config: Any, dtype: torch.dtype) -> None:
        routed = copy.copy(config)
        routed.shared_expert_intermediate_size = 0
        super().__init__(routed, dtype)
        shared = (config.num_shared_experts or 0) * config.moe_intermediate_size
        self.shared_experts = DecoderMLP(config, dtype, shared) if shared else None
        hidden = config.hidden_size
        self.multi_gate = bool(config.multi_gate)
        if self.multi_gate:
            self.image_gate = Linear(hidden, self.num_experts, False, dtype)
            self.audio_gate = Linear(hidden, self.num_experts, False, dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        weights, experts = self.route(self.gate, x)
        kinds = get_forward_context().token_modality if self.multi_gate else None
        if kinds is not None:
            for code, gate in ((IMAGE, self.image_gate), (AUDIO, self.audio_gate)):
                rows = (kinds == code).nonzero().flatten()
                if len(rows):
                    weights[rows], experts[rows] = self.route(gate, x[rows])
        if self.shared_experts is None:
            return self.mix(x, weights, experts, residual)
        # (routed + shared) + residual, the reference's order of additions.
        shared = self.shared_experts.without_residual(x)
        return self.mix(x, weights, experts, shared).add_(residual)


class BailingMoeForCausalLM(_MoeMixin, LlamaForCausalLM):
    """The Bailing-MoE decoder of `llm_config` (see the module docstring)."""

    architectures = ("BailingMoeForCausalLM",)
    llama_default_rope = False  # its rotary is `_BailingRope`
    token_modalities = ("image", "audio")  # codes IMAGE, AUDIO: routed by their own gates

    def __init__(self, config: Any, dtype: torch.dtype, max_positions: int) -> None:
        config = copy.copy(config)
        config.attention_bias = bool(config.use_qkv_bias)
        config.mlp_bias = False
        if config.intermediate_size is None:
            config.intermediate_size = config.moe_intermediate_size
        super().__init__(config, dtype, max_positions)
        if bool(config.use_bias) != config.attention_bias:  # `dense` has its own bias flag
            for layer in self.layers:
                attn = layer.self_attn
                attn.o_proj = Linear(attn.q_size, config.hidden_size, bool(config.use_bias), dtype)
        self.norm_head = bool(getattr(config, "norm_head", False))

    @classmethod
    def reads_plain_config(cls, hf_config: Any) -> bool:
        return False

    @classmethod
    def _rotary_frequencies(cls, config: Any) -> Any:
        return _BailingRope(config)

    def make_mlp(self, config: Any, layer_idx: int, dtype: torch.dtype) -> nn.Module | None:
        sparse = bool(config.num_experts) and layer_idx >= config.first_k_dense_replace
        return BailingSparseMoe(config, dtype) if sparse else None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        def renamed() -> Iterable[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                for pattern, replacement in _RENAMES:
                    name = pattern.sub(replacement, name)
                yield name, tensor

        loaded = super().load_weights(renamed())
        if self.norm_head and "lm_head.weight" in loaded:
            w = self.lm_head.weight
            w32 = w.float()
            w.copy_((w32 / (torch.norm(w32, p=2, dim=0, keepdim=True) + 1e-7)).to(w.dtype))
        return loaded

    def expected_weight_names(self) -> set[str]:
        names = {n for n in super().expected_weight_names() if "qkv_proj" not in n}
        for pname, _ in self.named_parameters():
            if ".qkv_proj." in pname:
                names.add("model." + pname)
        return names


class MingThinker(BailingMoeForCausalLM):
    """The thinker part of a Ming-Omni checkpoint: also sends its (input embedding, final
    normed hidden state) rows to the talker."""

    architectures = ("OmnistageMingThinker",)

    def __init__(self, config: Any, dtype: torch.dtype, max_positions: int) -> None:
        super().__init__(config, dtype, max_positions)
        self.hidden_output_layers = (0, config.num_hidden_layers)
