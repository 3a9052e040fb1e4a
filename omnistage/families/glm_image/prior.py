"""GLM-Image's autoregressive prior (`GlmImageForConditionalGeneration`) on our hot path.

GLM-Image draws in two halves; this is the first: a GLM-4 text decoder that reads a
text prompt ending in the target grid sizes and writes image tokens — a small preview
grid, then the large grid of the target size, then an end token (docs/glm_image_prior.md).
What it runs, as transformers' `GlmImageTextModel` + `lm_head`:

- "sandwich" decoder layers: `x + post_self_attn_norm(attn(input_norm(x)))`, then
  `x + post_mlp_norm(mlp(post_attention_norm(x)))`; q/k/v with bias, o_proj without;
  the MLP's fused `gate_up_proj` is split into gate and up here (one GEMM each, so the
  CPU platform can pack and fuse them);
- partial rotary (`partial_rotary_factor`, 0.5: the first half of each head rotates,
  neox style) with non-interleaved 3-D RoPE (`mrope_section`, [8, 12, 12]); positions
  are 3-D for the prompt and for every generated token (`MultimodalDecoderInputs`:
  `mrope_positions`, `decode_positions`, built by `glm_image_prompt.py`), 1-D ones
  rotate as three equal rows;
- `lm_head` scores only the vision vocabulary (`vision_vocab_size`, 16512: image codes,
  image start / end and spare ids), whose ids are also the first rows of the token
  embedding, so a generated token is fed back as it is.

The checkpoint is the whole `GlmImageForConditionalGeneration` (its `config.json` holds
`text_config`, `vision_config`, `vq_config`); the engine serves its `text_config`
(`engine_config_for`) and loads `model.language_model.*` and `lm_head.*`. The vision
encoder and VQ model (`model.visual.*`, `model.vqmodel.*`) turn condition images into
tokens for image-to-image prompts, which are **not supported**: the prompt builder and
the pipeline stage refuse prompts with images with a ValueError.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from omnistage.families.llama.model import DecoderMLP
from omnistage.layers.attention import attend, write_kv
from omnistage.layers.forward_context import get_forward_context
from omnistage.layers.linear import Embedding, Linear, load_shard
from omnistage.layers.norm import RMSNorm
from omnistage.layers.rotary import RotaryEmbedding, rotate
from omnistage.models.base import CausalLM
from omnistage.models.parts import ROOT_CONFIG_ATTR

MODEL_TYPE = "glm_image"
_SKIPPED_PREFIXES = ("model.visual.", "model.vqmodel.")
"""Weights of the image-to-image encoders (not run here)."""


class GlmImageAttention(nn.Module):
    """Self-attention over the paged cache with partial 3-D rotary embedding."""

    def __init__(self, config: Any, dtype: torch.dtype, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        bias = bool(config.attention_bias)
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias, dtype)
        self.o_proj = Linear(self.q_size, config.hidden_size, False, dtype)
        self.rotary = rotary
        self.rotary_dim = rotary.cos.shape[1]
        self.kv_cache: torch.Tensor | None = None

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        meta = get_forward_context()
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        cos, sin = self.rotary.tables(positions)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q, k = self._rotate_partial(q, cos, sin), self._rotate_partial(k, cos, sin)
        write_kv(self.kv_cache, k, v, meta.slot_mapping)
        out = attend(q, k, v, self.kv_cache, meta, self.scale)
        return self.o_proj(out.reshape(-1, self.q_size))

    def _rotate_partial(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        """Rotate the first `rotary_dim` features of each head (neox halves), keep the rest."""
        d = self.rotary_dim
        if d == self.head_dim:
            return rotate(x, cos, sin)
        return torch.cat([rotate(x[..., :d], cos, sin), x[..., d:]], dim=-1)


class GlmImageDecoderLayer(nn.Module):
    """`GlmImageTextDecoderLayer`: pre- and post-norm around both attention and MLP."""

    def __init__(self, config: Any, dtype: torch.dtype, rotary: RotaryEmbedding) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = RMSNorm(hidden, eps, dtype)
        self.self_attn = GlmImageAttention(config, dtype, rotary)
        self.post_self_attn_layernorm = RMSNorm(hidden, eps, dtype)
        self.post_attention_layernorm = RMSNorm(hidden, eps, dtype)
        self.mlp = DecoderMLP(config, dtype)
        self.post_mlp_layernorm = RMSNorm(hidden, eps, dtype)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        x = x + self.post_self_attn_layernorm(self.self_attn(positions, self.input_layernorm(x)))
        mlp_out = self.mlp.without_residual(self.post_attention_layernorm(x))
        return x + self.post_mlp_layernorm(mlp_out)


class GlmImagePrior(CausalLM):
    """The prior's text decoder; its logits cover the vision vocabulary only."""

    architectures = ("GlmImageForConditionalGeneration",)
    supports_mrope = True

    @classmethod
    def engine_config_for(cls, hf_config: Any) -> Any:
        """The config the engine serves a GLM-Image checkpoint with: a copy of its
        `text_config` (the sizes, `eos_token_id` = the image end token and context length
        the engine reads), naming this architecture and carrying the whole config
        (`ROOT_CONFIG_ATTR`). Already such a view: returned as it is."""
        if getattr(hf_config, "model_type", None) != MODEL_TYPE:
            return hf_config
        text = copy.deepcopy(hf_config.get_text_config())
        text.architectures = list(cls.architectures)
        setattr(text, ROOT_CONFIG_ATTR, hf_config)
        return text

    def __init__(self, config: Any, dtype: torch.dtype, max_positions: int) -> None:
        super().__init__()
        if getattr(config, "model_type", None) == MODEL_TYPE:  # the whole checkpoint's config
            config = self.engine_config_for(config)
        self.config = config
        self.dtype = dtype
        rope = dict(config.rope_parameters or {})
        section = [int(n) for n in rope.get("mrope_section", [8, 12, 12])]  # transformers' default
        rotary = RotaryEmbedding(self._hf_rotary(config), max_positions, dtype)
        if len(section) != 3 or sum(section) * 2 != rotary.cos.shape[1]:
            raise ValueError(
                f"rope_parameters: mrope_section {section} must be 3 numbers summing to half "
                f"the rotary dimension ({rotary.cos.shape[1] // 2})"
            )
        rotary.enable_mrope(section, interleaved=False)
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(
            GlmImageDecoderLayer(config, dtype, rotary) for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.lm_head = Linear(config.hidden_size, config.vision_vocab_size, False, dtype)
        attn = self.layers[0].self_attn
        self.num_layers = config.num_hidden_layers
        self.num_kv_heads = attn.num_kv_heads
        self.head_dim = attn.head_dim

    @staticmethod
    def _hf_rotary(config: Any) -> nn.Module:
        from transformers.models.glm_image.modeling_glm_image import GlmImageTextRotaryEmbedding

        return GlmImageTextRotaryEmbedding(config)

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

    def bind_kv_cache(self, kv_caches: list[torch.Tensor]) -> None:
        for layer, cache in zip(self.layers, kv_caches, strict=True):
            layer.self_attn.kv_cache = cache

    # -- weights -------------------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for hf_name, tensor in weights:
            for name, offset in self._targets(hf_name, tensor):
                if name not in params:
                    raise ValueError(
                        f"checkpoint tensor {hf_name!r} has no parameter {name!r} in "
                        f"{type(self).__name__}"
                    )
                param, part = params[name], tensor.to(self.dtype)
                if offset is None:
                    if part.shape != param.shape:
                        raise ValueError(
                            f"checkpoint tensor {hf_name!r} has shape {tuple(part.shape)}, "
                            f"expected {tuple(param.shape)}"
                        )
                    param.copy_(part)
                else:
                    load_shard(param, part[offset[1] : offset[1] + offset[2]], offset[0])
                loaded.add(name if offset is None else f"{name}@{offset[0]}")
        return loaded

    def _targets(
        self, hf_name: str, tensor: torch.Tensor
    ) -> list[tuple[str, tuple[int, int, int] | None]]:
        """HF name -> [(our parameter, None or (row offset in it, first source row, rows))]."""
        if hf_name.startswith(_SKIPPED_PREFIXES) or "rotary_emb" in hf_name:
            return []
        name = hf_name.removeprefix("model.language_model.").removeprefix("model.")
        attn = self.layers[0].self_attn
        for part, offset in (
            ("q_proj", 0),
            ("k_proj", attn.q_size),
            ("v_proj", attn.q_size + attn.kv_size),
        ):
            if f".self_attn.{part}." in name:
                rows = tensor.shape[0]
                return [(name.replace(part, "qkv_proj"), (offset, 0, rows))]
        if ".mlp.gate_up_proj." in name:
            half = tensor.shape[0] // 2
            return [
                (name.replace("gate_up_proj", "gate_proj"), (0, 0, half)),
                (name.replace("gate_up_proj", "up_proj"), (0, half, half)),
            ]
        return [(name, None)]

    def expected_weight_names(self) -> set[str]:
        """Keys `load_weights` must have set for the model to be complete."""
        attn = self.layers[0].self_attn
        names = set()
        for pname, _ in self.named_parameters():
            if ".qkv_proj." in pname:
                names |= {f"{pname}@{o}" for o in (0, attn.q_size, attn.q_size + attn.kv_size)}
            elif ".gate_proj." in pname or ".up_proj." in pname:
                names.add(f"{pname}@0")
            else:
                names.add(pname)
        return names
