"""Dense decoder-only transformers of the Llama family on the paged-KV hot path.

`LlamaForCausalLM` (Llama 2/3, SmolLM, Mistral-style), `Qwen2ForCausalLM`
(bias on q/k/v) and `Qwen3ForCausalLM` (RMSNorm on q and k per head). Weights
load by HF parameter names; q/k/v and gate/up are fused into one matmul each,
which is faster on CPU than three (or two) smaller ones.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, ClassVar

import torch
from torch import nn

from omnistage.layers.attention import attend, rope_and_write_kv, write_kv
from omnistage.layers.decode_program import (
    AttentionShape,
    DecodeProgram,
    DecodeProgramBuilder,
    NotProgrammable,
    Value,
)
from omnistage.layers.forward_context import get_forward_context
from omnistage.layers.linear import Embedding, Linear, load_shard
from omnistage.layers.norm import RMSNorm, qk_norm_in_place
from omnistage.layers.rotary import DefaultRope, RotaryEmbedding
from omnistage.models.base import CausalLM

logger = logging.getLogger("omnistage")


class DecoderAttention(nn.Module):
    c_kernels = True
    """Whether q/k norm, rotary and the KV write may run as C kernels (1-D positions, a
    plain rotary). A subclass that changes keys or values before they are written
    (`keys_and_values`) turns it off, so every row of it takes the same torch path."""

    def __init__(
        self,
        config: Any,
        dtype: torch.dtype,
        rotary: RotaryEmbedding,
        qkv_bias: bool,
        qk_norm: bool,
    ) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size, qkv_bias, dtype)
        self.o_proj = Linear(
            self.q_size, config.hidden_size, getattr(config, "attention_bias", False), dtype
        )
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, dtype) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, dtype) if qk_norm else None
        self.rotary = rotary
        self.kv_cache: torch.Tensor | None = None

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor
    ) -> torch.Tensor:
        """Attention output plus `residual` (the add is fused into o_proj where possible)."""
        qkv = self.qkv_proj(x)
        meta = get_forward_context()
        rotary = self.rotary
        # The C kernels read 1-D positions and a plain cos/sin table; 3-D (mrope) positions
        # and other rotaries (Ming-flash's partial one) rotate in `rotary`, q/k norm first.
        c_path = self.c_kernels and positions.ndim == 1 and isinstance(rotary, RotaryEmbedding)
        normed = self.q_norm is None or (
            c_path
            and qk_norm_in_place(qkv, self.q_norm, self.k_norm, self.num_heads, self.num_kv_heads)
        )
        fused = (
            c_path
            and normed
            and rope_and_write_kv(
                qkv, positions, rotary.cos, rotary.sin, self.kv_cache, meta, self.num_heads
            )
        )
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if not fused:
            if not normed:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = rotary(positions, q, k)
            k, v = self.keys_and_values(k, v)
            write_kv(self.kv_cache, k, v, meta.slot_mapping)
        out = attend(q, k, v, self.kv_cache, meta, self.scale)
        return self.o_proj.add(out.reshape(-1, self.q_size), residual)

    def keys_and_values(
        self, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's keys (rotated) and values as they are written and attended: as
        computed here; a subclass with `c_kernels = False` may replace rows."""
        return k, v

    def add_to_program(self, b: DecodeProgramBuilder, x: Value, residual: Value) -> Value:
        """`forward` of a decode step as ops of a decode program."""
        if not isinstance(self.rotary, RotaryEmbedding):
            raise NotProgrammable(f"attention: rotary {type(self.rotary).__name__}")
        if not self.c_kernels:
            raise NotProgrammable(f"attention: {type(self).__name__} keeps the torch path")
        shape = AttentionShape(self.num_heads, self.num_kv_heads, self.head_dim)
        qkv = b.linear(x, self.qkv_proj)
        if self.q_norm is not None:
            b.qk_norm(qkv, shape, self.q_norm, self.k_norm)
        b.rope_and_write_kv(qkv, shape, self.rotary.cos, self.rotary.sin, self.kv_cache)
        out = b.attention(qkv, shape, self.kv_cache, self.scale)
        return b.linear(out, self.o_proj, "add", residual)


class DecoderMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)) + residual, each element-wise step fused into a GEMM."""

    def __init__(
        self, config: Any, dtype: torch.dtype, intermediate_size: int | None = None
    ) -> None:
        super().__init__()
        bias = getattr(config, "mlp_bias", False)
        inner = intermediate_size or config.intermediate_size
        self.gate_proj = Linear(config.hidden_size, inner, bias, dtype)
        self.up_proj = Linear(config.hidden_size, inner, bias, dtype)
        self.down_proj = Linear(inner, config.hidden_size, bias, dtype)

    def without_residual(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.up_proj.mul(x, self.gate_proj.silu(x)))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        gate = self.gate_proj.silu(x)
        return self.down_proj.add(self.up_proj.mul(x, gate), residual)

    def add_to_program(self, b: DecodeProgramBuilder, x: Value, residual: Value) -> Value:
        gate = b.linear(x, self.gate_proj, "silu")
        return b.linear(b.linear(x, self.up_proj, "mul", gate), self.down_proj, "add", residual)


class DecoderLayer(nn.Module):
    def __init__(
        self,
        config: Any,
        dtype: torch.dtype,
        rotary: RotaryEmbedding,
        qkv_bias: bool,
        qk_norm: bool,
        mlp: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.self_attn = DecoderAttention(config, dtype, rotary, qkv_bias, qk_norm)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.mlp = DecoderMLP(config, dtype) if mlp is None else mlp

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        x = self.self_attn(positions, self.input_layernorm(x), residual=x)
        return self.mlp(self.post_attention_layernorm(x), residual=x)

    def add_to_program(self, b: DecodeProgramBuilder, x: Value) -> Value:
        if type(self.mlp) is not DecoderMLP:
            raise NotProgrammable(f"feed-forward: {type(self.mlp).__name__}")
        x = self.self_attn.add_to_program(b, b.rms_norm(x, self.input_layernorm), x)
        return self.mlp.add_to_program(b, b.rms_norm(x, self.post_attention_layernorm), x)


class LlamaForCausalLM(CausalLM):
    architectures = ("LlamaForCausalLM", "MistralForCausalLM")
    qkv_bias = False
    qk_norm = False
    llama_default_rope: ClassVar[bool] = True
    """`_hf_rotary`'s `rope_type: default` equals `DefaultRope` (a test checks every class
    that says so); a subclass with another rotary sets False."""

    def __init__(self, config: Any, dtype: torch.dtype, max_positions: int) -> None:
        super().__init__()
        self.config = config
        self.dtype = dtype
        rotary = RotaryEmbedding(self._rotary_frequencies(config), max_positions, dtype)
        qkv_bias = self.qkv_bias or getattr(config, "attention_bias", False)
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(
            DecoderLayer(
                config, dtype, rotary, qkv_bias, self.qk_norm, self.make_mlp(config, i, dtype)
            )
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = Linear(config.hidden_size, config.vocab_size, False, dtype)
        if self.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        attn = self.layers[0].self_attn
        self.num_layers = config.num_hidden_layers
        self.num_kv_heads = attn.num_kv_heads
        self.head_dim = attn.head_dim
        self._program: DecodeProgram | None = None
        self._program_cache: int | None = None
        """The KV cache address the program was built for."""

    def make_mlp(self, config: Any, layer_idx: int, dtype: torch.dtype) -> nn.Module | None:
        """The feed-forward block of layer `layer_idx` (None: the dense SwiGLU)."""
        return None

    @classmethod
    def reads_plain_config(cls, hf_config: Any) -> bool:
        """Plain RoPE is computed here (`DefaultRope`); other rope types are transformers'."""
        return cls.llama_default_rope and DefaultRope.applies_to(hf_config)

    @classmethod
    def _rotary_frequencies(cls, config: Any) -> Any:
        """What `RotaryEmbedding` takes its frequencies from: `DefaultRope` where the class's
        transformers rotary computes plain RoPE as Llama's does and the config asks for it
        (no transformers import), else the transformers rotary module itself."""
        if cls.llama_default_rope and DefaultRope.applies_to(config):
            return DefaultRope(config)
        return cls._hf_rotary(config)

    @staticmethod
    def _hf_rotary(config: Any) -> nn.Module:
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        return LlamaRotaryEmbedding(config)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        if self.hidden_output_layers:
            return self._forward_capturing(positions, x)
        if positions.ndim == 1 and x.dtype == torch.float32 and x.is_contiguous():
            meta = get_forward_context()
            if meta.all_decode and meta.backend.runs_decode_programs:
                program = self._decode_program()
                if program is not None:
                    return program.run(x, positions, meta)
        for layer in self.layers:
            x = layer(positions, x)
        return self.norm(x)

    def _decode_program(self) -> DecodeProgram | None:
        """The layers as one C call for steps of decodes (`layers/decode_program.py`: the
        same arithmetic as the layers' forward, bit for bit), built on the first such step
        and again when the KV cache or a product's kernel path changed; None where a
        module has no C path here."""
        cache = self.layers[0].self_attn.kv_cache
        address = 0 if cache is None else cache.data_ptr()
        if address == self._program_cache and (self._program is None or self._program.current):
            return self._program
        self._program_cache, self._program = address, None
        try:
            b = DecodeProgramBuilder(self.config.hidden_size)
            x = b.input
            for layer in self.layers:
                x = layer.add_to_program(b, x)
            self._program = b.build(b.rms_norm(x, self.norm))
        except NotProgrammable as exc:
            logger.debug("%s: decode steps run layer by layer (%s)", type(self).__name__, exc)
        return self._program

    def _forward_capturing(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """`forward`, keeping the hidden states `hidden_output_layers` names for the stage."""
        wanted, captured = self.hidden_output_layers, {}
        for i, layer in enumerate(self.layers):
            if i in wanted:
                captured[i] = x
            x = layer(positions, x)
        out = captured[len(self.layers)] = self.norm(x)
        self._captured = torch.cat([captured[i] for i in wanted], dim=-1)
        return out

    def stage_hidden_states(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._captured if self.hidden_output_layers else hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def bind_kv_cache(self, kv_caches: list[torch.Tensor]) -> None:
        for layer, cache in zip(self.layers, kv_caches, strict=True):
            layer.self_attn.kv_cache = cache

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for hf_name, tensor in weights:
            target = self.weight_target(hf_name)
            if target is None:
                continue
            name, offset = target
            if name not in params:
                raise ValueError(
                    f"checkpoint tensor {hf_name!r} has no parameter {name!r} in {type(self).__name__}"
                )
            param = params[name]
            tensor = tensor.to(self.dtype)
            if offset is None:
                if tensor.shape != param.shape:
                    raise ValueError(
                        f"checkpoint tensor {hf_name!r} has shape {tuple(tensor.shape)}, expected {tuple(param.shape)}"
                    )
                param.copy_(tensor)
            else:
                load_shard(param, tensor, offset)
            loaded.add(hf_name if offset is None else f"{name}@{offset}")
        return loaded

    def weight_target(self, hf_name: str) -> tuple[str, int | None] | None:
        """HF name -> (our parameter name, row offset inside a fused parameter or None);
        None for a tensor this model does not load."""
        if "rotary_emb" in hf_name:
            return None
        name = hf_name.removeprefix("model.")
        if name == "lm_head.weight" and self.tie_word_embeddings:
            return None
        attn = self.layers[0].self_attn
        fused = {
            "self_attn.q_proj": ("self_attn.qkv_proj", 0),
            "self_attn.k_proj": ("self_attn.qkv_proj", attn.q_size),
            "self_attn.v_proj": ("self_attn.qkv_proj", attn.q_size + attn.kv_size),
        }
        for part, (fused_name, offset) in fused.items():
            if f".{part}." in name:
                return name.replace(part, fused_name), offset
        return name, None

    def expected_weight_names(self) -> set[str]:
        """Keys `load_weights` must have set for the model to be complete."""
        names = set()
        attn = self.layers[0].self_attn
        for pname, _ in self.named_parameters():
            if pname.endswith("qkv_proj.weight") or pname.endswith("qkv_proj.bias"):
                names |= {
                    f"{pname}@0",
                    f"{pname}@{attn.q_size}",
                    f"{pname}@{attn.q_size + attn.kv_size}",
                }
            else:
                names.add(("model." if not pname.startswith("lm_head") else "") + pname)
        return names


class Qwen2ForCausalLM(LlamaForCausalLM):
    architectures = ("Qwen2ForCausalLM",)
    qkv_bias = True

    @staticmethod
    def _hf_rotary(config: Any) -> nn.Module:
        from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

        return Qwen2RotaryEmbedding(config)


class Qwen3ForCausalLM(LlamaForCausalLM):
    architectures = ("Qwen3ForCausalLM",)
    qk_norm = True

    @staticmethod
    def _hf_rotary(config: Any) -> nn.Module:
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

        return Qwen3RotaryEmbedding(config)
