"""Bagel's language model: a Qwen2 mixture of transformers (MoT) with two experts.

Every decoder layer holds two sets of weights for one shared attention: the
understanding expert (Qwen2's own names: `self_attn.q_proj`, `mlp`,
`input_layernorm`, …) and the generation expert (the same names with
`_moe_gen`). Text tokens go through the understanding expert, image (latent)
tokens through the generation expert; both write keys and values into one
sequence and attend over all of it. Attention is Qwen2's with an RMSNorm on q
and k per head (`q_norm`, `k_norm`; Bagel sets `qk_norm` on), applied before RoPE.

Two passes, as the reference's `forward_inference` runs them:

- `prefill`: text tokens (understanding expert only), causal, after a context;
  returns their hidden states and the context grown by their keys and values;
- `denoise`: a block of start-of-image, latent and end-of-image tokens, all at
  one RoPE position, attending to a context and to each other (not causal),
  writing nothing back;
- `prefill_image`: an input image's block (ViT tokens through the understanding
  expert, or clean VAE latent tokens through the generation expert), laid out as
  `denoise`'s but kept: the context grows by its tokens and by one RoPE position.

Parameter names are the checkpoint's under `language_model.` (`model.layers.N…`,
`model.norm_moe_gen`, `lm_head`), so `load_state_dict` takes them as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.bagel.context import KVContext
from omnistage.layers.linear import Embedding, Linear
from omnistage.layers.norm import RMSNorm
from omnistage.layers.rotary import DefaultRope, RotaryEmbedding

Experts = tuple[torch.Tensor, torch.Tensor] | None
"""(understanding rows, generation rows) of a mixed block; None: all understanding."""


def by_expert(x: torch.Tensor, experts: Experts, und: Callable, gen: Callable) -> torch.Tensor:
    """`und` on the understanding rows of `x` and `gen` on the generation rows, in place."""
    if experts is None:
        return und(x)
    und_rows, gen_rows = experts
    a, b = und(x[und_rows]), gen(x[gen_rows])
    out = a.new_empty((x.shape[0], *a.shape[1:]))
    out[und_rows] = a
    out[gen_rows] = b
    return out


class MoTAttention(nn.Module):
    def __init__(self, config: Any, dtype: torch.dtype, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.hidden_size // self.num_heads
        hidden, q_size = config.hidden_size, self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        eps = config.rms_norm_eps
        for suffix in ("", "_moe_gen"):
            setattr(self, f"q_proj{suffix}", Linear(hidden, q_size, True, dtype))
            setattr(self, f"k_proj{suffix}", Linear(hidden, kv_size, True, dtype))
            setattr(self, f"v_proj{suffix}", Linear(hidden, kv_size, True, dtype))
            setattr(self, f"o_proj{suffix}", Linear(q_size, hidden, False, dtype))
            setattr(self, f"q_norm{suffix}", RMSNorm(self.head_dim, eps, dtype))
            setattr(self, f"k_norm{suffix}", RMSNorm(self.head_dim, eps, dtype))
        self.rotary = rotary

    def _qkv(self, suffix: str) -> Callable[[torch.Tensor], torch.Tensor]:
        q_proj, k_proj, v_proj = (getattr(self, f"{p}_proj{suffix}") for p in "qkv")
        q_norm, k_norm = getattr(self, f"q_norm{suffix}"), getattr(self, f"k_norm{suffix}")
        h, kv, d = self.num_heads, self.num_kv_heads, self.head_dim

        def run(x: torch.Tensor) -> torch.Tensor:
            q = q_norm(q_proj(x).view(-1, h, d))
            k = k_norm(k_proj(x).view(-1, kv, d))
            return torch.cat([q, k, v_proj(x).view(-1, kv, d)], dim=1)

        return run

    def forward(
        self,
        x: torch.Tensor,
        experts: Experts,
        positions: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor],
        causal: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Attention output of `x` ([T, hidden]) after `past` (keys, values), and the keys
        and values of `x` ([T, kv_heads, head_dim], RoPE applied)."""
        qkv = by_expert(x, experts, self._qkv(""), self._qkv("_moe_gen"))
        q, k, v = qkv.split([self.num_heads, self.num_kv_heads, self.num_kv_heads], dim=1)
        q, k = self.rotary(positions, q, k)
        keys, values = torch.cat([past[0], k]), torch.cat([past[1], v])
        out = attend(q, keys, values, causal).reshape(x.shape[0], -1)
        out = by_expert(out, experts, self.o_proj, self.o_proj_moe_gen)
        return out, k, v


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, causal: bool) -> torch.Tensor:
    """Softmax attention of q [T, heads, d] over keys/values [S, kv_heads, d] (the last T
    of them are q's own tokens); causal: token i sees the S - T before it and itself."""
    t, s = q.shape[0], keys.shape[0]
    rep = q.shape[1] // keys.shape[1]
    k = keys.repeat_interleave(rep, dim=1).transpose(0, 1)
    v = values.repeat_interleave(rep, dim=1).transpose(0, 1)
    mask = None
    if causal:
        mask = torch.arange(s)[None, :] <= torch.arange(t)[:, None] + (s - t)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k, v, attn_mask=mask)
    return out.transpose(0, 1)


class MoTMLP(nn.Module):
    """Qwen2's SwiGLU MLP (`gate_proj`, `up_proj`, `down_proj`, no bias)."""

    def __init__(self, config: Any, dtype: torch.dtype) -> None:
        super().__init__()
        hidden, inter = config.hidden_size, config.intermediate_size
        self.gate_proj = Linear(hidden, inter, False, dtype)
        self.up_proj = Linear(hidden, inter, False, dtype)
        self.down_proj = Linear(inter, hidden, False, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoTDecoderLayer(nn.Module):
    def __init__(self, config: Any, dtype: torch.dtype, rotary: RotaryEmbedding) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.self_attn = MoTAttention(config, dtype, rotary)
        self.mlp = MoTMLP(config, dtype)
        self.mlp_moe_gen = MoTMLP(config, dtype)
        for suffix in ("", "_moe_gen"):
            setattr(self, f"input_layernorm{suffix}", RMSNorm(config.hidden_size, eps, dtype))
            setattr(
                self, f"post_attention_layernorm{suffix}", RMSNorm(config.hidden_size, eps, dtype)
            )

    def forward(
        self,
        x: torch.Tensor,
        experts: Experts,
        positions: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor],
        causal: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = by_expert(x, experts, self.input_layernorm, self.input_layernorm_moe_gen)
        h, k, v = self.self_attn(h, experts, positions, past, causal)
        x = x + h

        def und(rows: torch.Tensor) -> torch.Tensor:
            return self.mlp(self.post_attention_layernorm(rows))

        def gen(rows: torch.Tensor) -> torch.Tensor:
            return self.mlp_moe_gen(self.post_attention_layernorm_moe_gen(rows))

        return x + by_expert(x, experts, und, gen), k, v


class MoTModel(nn.Module):
    def __init__(self, config: Any, dtype: torch.dtype) -> None:
        super().__init__()
        frequencies = DefaultRope(config) if DefaultRope.applies_to(config) else None
        if frequencies is None:
            from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

            frequencies = Qwen2RotaryEmbedding(config)
        rotary = RotaryEmbedding(frequencies, config.max_position_embeddings, dtype)
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size, dtype)
        self.layers = nn.ModuleList(
            MoTDecoderLayer(config, dtype, rotary) for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.norm_moe_gen = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)


class MoTLanguageModel(nn.Module):
    """`language_model` of a Bagel checkpoint."""

    def __init__(self, config: Any, dtype: torch.dtype) -> None:
        super().__init__()
        self.config = config
        self.dtype = dtype
        self.model = MoTModel(config, dtype)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, False, dtype)
        attn = self.model.layers[0].self_attn
        self.num_layers = config.num_hidden_layers
        self.num_kv_heads = attn.num_kv_heads
        self.head_dim = attn.head_dim

    def empty_context(self) -> KVContext:
        return KVContext.empty(self.num_layers, self.num_kv_heads, self.head_dim, self.dtype)

    def _run(
        self,
        x: torch.Tensor,
        experts: Experts,
        positions: torch.Tensor,
        context: KVContext,
        causal: bool,
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        keys, values = [], []
        for i, layer in enumerate(self.model.layers):
            x, k, v = layer(x, experts, positions, (context.keys[i], context.values[i]), causal)
            keys.append(k)
            values.append(v)
        x = by_expert(x, experts, self.model.norm, self.model.norm_moe_gen)
        return x, keys, values

    @torch.inference_mode()
    def prefill(
        self, token_ids: torch.Tensor, context: KVContext
    ) -> tuple[torch.Tensor, KVContext]:
        """Text tokens after `context`, causal: (their final hidden states, the grown context)."""
        positions = torch.arange(context.rope, context.rope + token_ids.shape[0])
        x = self.model.embed_tokens(token_ids)
        hidden, keys, values = self._run(x, None, positions, context, causal=True)
        return hidden, context.extended(keys, values)

    def _block(
        self, block: torch.Tensor, gen_rows: torch.Tensor | None, context: KVContext
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        experts = None
        if gen_rows is not None:
            mask = torch.ones(block.shape[0], dtype=torch.bool)
            mask[gen_rows] = False
            experts = (mask.nonzero().squeeze(1), gen_rows)
        positions = torch.full((block.shape[0],), context.rope, dtype=torch.long)
        return self._run(block, experts, positions, context, causal=False)

    @torch.inference_mode()
    def denoise(
        self, block: torch.Tensor, gen_rows: torch.Tensor, context: KVContext
    ) -> torch.Tensor:
        """Final hidden states of one image block ([T, hidden] embeddings, `gen_rows` its
        latent tokens, the others text markers), every token at `context.rope`."""
        return self._block(block, gen_rows, context)[0]

    @torch.inference_mode()
    def prefill_image(
        self, block: torch.Tensor, gen_rows: torch.Tensor | None, context: KVContext
    ) -> KVContext:
        """`context` grown by an input image's block (`<|vision_start|>`, its tokens,
        `<|vision_end|>`: [T, hidden] embeddings, all at `context.rope`, not causal;
        `gen_rows` its VAE tokens, None: all understanding, as ViT tokens are). The block
        takes one RoPE position: the next one is `context.rope + 1` (the reference's
        `prepare_vit_images` / `prepare_vae_images`)."""
        _, keys, values = self._block(block, gen_rows, context)
        return context.extended(keys, values, rope=context.rope + 1)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
