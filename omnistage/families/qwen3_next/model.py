"""Qwen3.5 and Qwen3-Next: hybrid decoders of gated delta-net and gated full-attention layers.

`config.layer_types` says per layer which token mixer it has:
- "linear_attention": a `GatedDeltaNet` (families/qwen3_next/gated_delta_net.py) over per-request
  recurrent state (conv + delta-rule state in the runner's state slots);
- "full_attention": `GatedAttention` over the paged KV cache — q, k RMS-normed per head,
  rotary on the first `partial_rotary_factor` of each head, and the output multiplied by
  sigmoid of a gate the q projection also produces (rows `[q_h, gate_h]` per head).

Every RMSNorm of the decoder (not the delta-net's gated one) scales by `1 + weight`
(`ZeroCenteredRMSNorm`). Qwen3.5's layers end in a dense SwiGLU; Qwen3-Next's in a
sparse MoE with a sigmoid-gated shared expert (families/qwen_moe/model.py), dense on
`mlp_only_layers`. Only full-attention layers get KV caches (`num_attention_layers`);
`recurrent_state_shapes()` lists the delta-net layers' state. Vision weights of the
checkpoints are skipped.

Multi-token prediction: when the config has `mtp_num_hidden_layers` (or
`num_nextn_predict_layers`) and the checkpoint has the `mtp.*` weights, they load into
`self.mtp` (a `MultiTokenPredictor`); without those weights `self.mtp` is None. It is
run by the MTP proposer (spec_decode/mtp.py), never by `forward`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, ClassVar

import torch
from torch import nn

from omnistage.families.llama.model import DecoderMLP
from omnistage.families.qwen3_next.gated_delta_net import GatedDeltaNet
from omnistage.families.qwen_moe.model import _MoeMixin
from omnistage.layers.attention import attend, write_kv
from omnistage.layers.forward_context import get_forward_context
from omnistage.layers.linear import Embedding, Linear, load_shard
from omnistage.layers.norm import RMSNorm
from omnistage.layers.rotary import RotaryEmbedding
from omnistage.models.base import CausalLM

LINEAR, FULL = "linear_attention", "full_attention"
_SKIPPED = re.compile(r"^(model\.visual\.|visual\.)|rotary_emb")
_LINEAR_ATTN = re.compile(r"^layers\.(\d+)\.linear_attn\.(.+)$")
_QKV = re.compile(r"^((?:mtp\.)?layers\.\d+\.self_attn)\.([qkv])_proj\.(weight|bias)$")
_MTP_EXPERT = re.compile(r"^(mtp\.layers\.\d+\.mlp)\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")


class ZeroCenteredRMSNorm(RMSNorm):
    """RMSNorm scaling by `1 + weight` (the checkpoint stores the offset from one)."""

    def __init__(self, size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__(size, eps, dtype)
        self.weight.data.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(self.compute_dtype)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x * (1.0 + self.weight.to(self.compute_dtype))).to(dtype)


def rotate_partial(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox rotary on the first `cos.shape[-1]` features of each head; x: [T, heads, d],
    cos/sin: [T, rotary_dim]."""
    dim = cos.shape[-1]
    rot, rest = x[..., :dim], x[..., dim:]
    half = dim // 2
    rotated = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
    rot = rot * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)
    return torch.cat((rot, rest), dim=-1)


class GatedAttention(nn.Module):
    """Full attention with q/k norm, partial rotary and a sigmoid output gate."""

    def __init__(self, config: Any, dtype: torch.dtype, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.q_size = 2 * self.num_heads * self.head_dim  # query and gate
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        bias = bool(getattr(config, "attention_bias", False))
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias, dtype)
        self.o_proj = Linear(self.num_heads * self.head_dim, config.hidden_size, bias, dtype)
        self.q_norm = ZeroCenteredRMSNorm(self.head_dim, config.rms_norm_eps, dtype)
        self.k_norm = ZeroCenteredRMSNorm(self.head_dim, config.rms_norm_eps, dtype)
        self.rotary = rotary
        self.kv_cache: torch.Tensor | None = None

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor
    ) -> torch.Tensor:
        q_gate, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, gate = q_gate.view(-1, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        q = self.q_norm(q)
        k = self.k_norm(k.view(-1, self.num_kv_heads, self.head_dim))
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        cos, sin = self.rotary.tables(positions)
        q, k = rotate_partial(q, cos, sin), rotate_partial(k, cos, sin)
        meta = get_forward_context()
        write_kv(self.kv_cache, k, v, meta.slot_mapping)
        out = attend(q, k, v, self.kv_cache, meta, self.scale)
        out = out.reshape(-1, self.num_heads * self.head_dim) * torch.sigmoid(
            gate.reshape(out.shape[0], -1)
        )
        return self.o_proj.add(out, residual)


class HybridDecoderLayer(nn.Module):
    def __init__(
        self,
        config: Any,
        layer_type: str,
        dtype: torch.dtype,
        rotary: RotaryEmbedding,
        mlp: nn.Module | None,
    ) -> None:
        super().__init__()
        self.layer_type = layer_type
        self.input_layernorm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.post_attention_layernorm = ZeroCenteredRMSNorm(
            config.hidden_size, config.rms_norm_eps, dtype
        )
        if layer_type == LINEAR:
            self.linear_attn = GatedDeltaNet(config, dtype)
        else:
            self.self_attn = GatedAttention(config, dtype, rotary)
        self.mlp = DecoderMLP(config, dtype) if mlp is None else mlp

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        h = self.input_layernorm(x)
        if self.layer_type == LINEAR:
            x = self.linear_attn(h, residual=x)
        else:
            x = self.self_attn(positions, h, residual=x)
        return self.mlp(self.post_attention_layernorm(x), residual=x)


def num_mtp_layers(config: Any) -> int:
    """Multi-token-prediction layers a config declares (0: none)."""
    for key in ("mtp_num_hidden_layers", "num_nextn_predict_layers"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return 0


class MultiTokenPredictor(nn.Module):
    """The checkpoint's MTP module (`mtp.*`): at position `p` it takes the target's final
    (normed) hidden state `h_p` and the embedding `e` of the token at `p + 1`, and returns
    `norm(layer(fc([norm_e(e), norm_h(h_p)])))`, whose logits (the shared `lm_head`)
    predict the token at `p + 2`. Each layer is a gated full-attention decoder layer (MoE
    for Qwen3-Next). The proposer runs the first layer for every draft pass (as vLLM does),
    so only that one gets a KV cache (`num_attention_layers`)."""

    num_attention_layers = 1

    def __init__(
        self,
        config: Any,
        dtype: torch.dtype,
        rotary: RotaryEmbedding,
        mlps: list[nn.Module | None],
    ) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.fc = Linear(2 * hidden, hidden, False, dtype)
        self.pre_fc_norm_embedding = ZeroCenteredRMSNorm(hidden, eps, dtype)
        self.pre_fc_norm_hidden = ZeroCenteredRMSNorm(hidden, eps, dtype)
        self.layers = nn.ModuleList(
            HybridDecoderLayer(config, FULL, dtype, rotary, mlp) for mlp in mlps
        )
        self.norm = ZeroCenteredRMSNorm(hidden, eps, dtype)
        attn = self.layers[0].self_attn
        self.num_kv_heads, self.head_dim = attn.num_kv_heads, attn.head_dim

    def bind_kv_cache(self, kv_caches: list[torch.Tensor]) -> None:
        """The caches of the first `len(kv_caches)` layers."""
        for layer, cache in zip(self.layers[: len(kv_caches)], kv_caches, strict=True):
            layer.self_attn.kv_cache = cache

    def forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        layer: int = 0,
    ) -> torch.Tensor:
        x = torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], -1)
        return self.norm(self.layers[layer](positions, self.fc(x)))


class Qwen3_5ForCausalLM(CausalLM):
    """Qwen3.5 (text): hybrid layers with dense SwiGLU MLPs and separate delta-net
    projections (`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`)."""

    architectures = ("Qwen3_5ForCausalLM",)
    has_recurrent_state: ClassVar[bool] = True
    interleaved_projections: ClassVar[bool] = False
    """Delta-net projections in Qwen3-Next's per-key-head layout (`in_proj_qkvz`, `in_proj_ba`)."""

    def __init__(self, config: Any, dtype: torch.dtype, max_positions: int) -> None:
        super().__init__()
        self.config = config
        self.dtype = dtype
        layer_types = list(config.layer_types)
        for i, kind in enumerate(layer_types):
            if kind not in (LINEAR, FULL):
                raise ValueError(f"layer_types[{i}]: unknown layer type {kind!r}")
        if len(layer_types) != config.num_hidden_layers:
            raise ValueError(
                f"layer_types: {len(layer_types)} entries for {config.num_hidden_layers} layers"
            )
        rotary = RotaryEmbedding(self._hf_rotary(config), max_positions, dtype)
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(
            HybridDecoderLayer(config, kind, dtype, rotary, self.make_mlp(config, i, dtype))
            for i, kind in enumerate(layer_types)
        )
        self.norm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = Linear(config.hidden_size, config.vocab_size, False, dtype)
        if self.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        mtp_layers = num_mtp_layers(config)
        self.mtp: MultiTokenPredictor | None = (
            MultiTokenPredictor(
                config,
                dtype,
                rotary,
                [self.make_mlp(config, i, dtype) for i in range(mtp_layers)],
            )
            if mtp_layers
            else None
        )
        """The checkpoint's multi-token-prediction module (None: the config or the
        checkpoint has none)."""
        self.attention_layers = [
            layer.self_attn for layer in self.layers if layer.layer_type == FULL
        ]
        self.delta_net_layers = [
            layer.linear_attn for layer in self.layers if layer.layer_type == LINEAR
        ]
        self.num_layers = config.num_hidden_layers
        self.num_attention_layers = len(self.attention_layers)
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads
        )

    def make_mlp(self, config: Any, layer_idx: int, dtype: torch.dtype) -> nn.Module | None:
        """The feed-forward block of layer `layer_idx` (None: the dense SwiGLU)."""
        return None

    @staticmethod
    def _hf_rotary(config: Any) -> nn.Module:
        # Text positions are equal on the three mrope axes, so 1-D rotary is exact.
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

        return Qwen3_5TextRotaryEmbedding(config)

    # -- state ------------------------------------------------------------------------------------
    def recurrent_state_shapes(self) -> list[tuple[tuple[int, ...], ...]]:
        return [layer.state_shapes() for layer in self.delta_net_layers]

    def bind_recurrent_state(self, states: list[Any]) -> None:
        for layer, state in zip(self.delta_net_layers, states, strict=True):
            layer.state = state

    def bind_kv_cache(self, kv_caches: list[torch.Tensor]) -> None:
        for layer, cache in zip(self.attention_layers, kv_caches, strict=True):
            layer.kv_cache = cache

    def set_chunk_size(self, chunk_size: int) -> None:
        """Tokens per chunk of the delta-net's chunked form (tests use small ones)."""
        if chunk_size < 1:
            raise ValueError(f"chunk_size: {chunk_size} must be positive")
        for layer in self.delta_net_layers:
            layer.chunk_size = chunk_size

    # -- forward ----------------------------------------------------------------------------------
    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        for layer in self.layers:
            x = layer(positions, x)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    # -- weights ----------------------------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for hf_name, tensor in weights:
            if _SKIPPED.search(hf_name):
                continue
            name = hf_name.removeprefix("model.language_model.").removeprefix("model.")
            if name == "lm_head.weight" and self.tie_word_embeddings:
                continue
            if name.startswith("mtp.") and self.mtp is None:
                continue  # MTP weights of a config that declares no MTP layers
            if m := _MTP_EXPERT.match(name):
                block = self.get_submodule(m.group(1))
                block.load_expert(int(m.group(2)), m.group(3), tensor.to(self.dtype))
                loaded.add(f"{m.group(1)}.experts.{m.group(2)}.{m.group(3)}")
            elif m := _LINEAR_ATTN.match(name):
                layer = self.layers[int(m.group(1))]
                keys = (
                    layer.linear_attn.load(m.group(2), tensor) if layer.layer_type == LINEAR else []
                )
                if not keys:
                    raise ValueError(
                        f"checkpoint tensor {hf_name!r} has no parameter in {type(self).__name__}"
                    )
                loaded.update(f"layers.{m.group(1)}.linear_attn.{k}" for k in keys)
            elif m := _QKV.match(name):
                attn = self.get_submodule(m.group(1))
                offset = {"q": 0, "k": attn.q_size, "v": attn.q_size + attn.kv_size}[m.group(2)]
                target = f"{m.group(1)}.qkv_proj.{m.group(3)}"
                load_shard(params[target], tensor.to(self.dtype), offset)
                loaded.add(f"{target}@{offset}")
            else:
                if name not in params:
                    raise ValueError(
                        f"checkpoint tensor {hf_name!r} has no parameter {name!r} in {type(self).__name__}"
                    )
                param = params[name]
                if tensor.shape != param.shape:
                    raise ValueError(
                        f"checkpoint tensor {hf_name!r} has shape {tuple(tensor.shape)}, expected {tuple(param.shape)}"
                    )
                param.copy_(tensor.to(self.dtype))
                loaded.add(name)
        if self.mtp is not None and not any(n.startswith("mtp.") for n in loaded):
            self.mtp = None  # the checkpoint has no MTP weights: MTP stays unavailable
        return loaded

    def expected_weight_names(self) -> set[str]:
        """Keys `load_weights` must have set for the model to be complete."""
        names: set[str] = set()
        for pname, _ in self.named_parameters():
            if ".linear_attn." in pname:
                continue
            if ".qkv_proj." in pname:
                attn = self.get_submodule(pname.rsplit(".", 2)[0])
                offsets = (0, attn.q_size, attn.q_size + attn.kv_size)
                names.update(f"{pname}@{o}" for o in offsets)
            else:
                names.add(pname)
        for i, layer in enumerate(self.layers):
            if layer.layer_type == LINEAR:
                keys = layer.linear_attn.expected_keys(self.interleaved_projections)
                names.update(f"layers.{i}.linear_attn.{k}" for k in keys)
        return names


class Qwen3NextForCausalLM(_MoeMixin, Qwen3_5ForCausalLM):
    """Qwen3-Next: the hybrid layers with sparse MoE blocks (a gated shared expert in each)
    and Qwen3-Next's interleaved delta-net projections."""

    architectures = ("Qwen3NextForCausalLM",)
    interleaved_projections = True

    @staticmethod
    def _hf_rotary(config: Any) -> nn.Module:
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRotaryEmbedding

        return Qwen3NextRotaryEmbedding(config)
