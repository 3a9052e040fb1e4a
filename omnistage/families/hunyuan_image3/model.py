"""`HunyuanImage3ForCausalMM`: HunyuanImage-3's autoregressive MoE decoder on the paged-KV
hot path, with its own sampler.

It serves the text half of the model: it reads the prompt, thinks
(`<think>…</think>`), writes its recaption (`<recaption>…</recaption>`) and the
image's aspect ratio, all by next-token prediction with `wte`, the decoder layers
(`layers.py`), `ln_f` and `lm_head`. Its `sample()` is `HunyuanImage3Sampler`
(`prefer_model_sampler`), which the runner's one sampling dispatch calls with the
rows' real histories. The image head (patch embedder, timestep embedders, final
layer, VAE) and the vision encoder are other modules of the same checkpoint; this
class skips their weights (`IMAGE_HEAD_PREFIXES`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from omnistage.families.hunyuan_image3.layers import HunyuanDecoderLayer, ImageSpan
from omnistage.families.hunyuan_image3.sampler import HunyuanImage3Sampler
from omnistage.families.hunyuan_image3.tokens import HunyuanTokens, first_eos
from omnistage.layers.forward_context import get_forward_context
from omnistage.layers.linear import Embedding, Linear
from omnistage.layers.norm import RMSNorm
from omnistage.layers.rotary import DefaultRope, RotaryEmbedding
from omnistage.models.base import CausalLM
from omnistage.sample import SamplingMetadata

IMAGE_HEAD_PREFIXES = (
    "vae.",
    "vision_model.",
    "vision_aligner.",
    "patch_embed.",
    "time_embed.",
    "time_embed_2.",
    "timestep_emb.",
    "final_layer.",
    "guidance_emb.",
    "timestep_r_emb.",
)


def enable_2d_rope(rotary: RotaryEmbedding) -> None:
    """Let the table also take [3, T] (index, row, column) positions: frequency i rotates
    by the row for even i and by the column for odd i (the reference's 2-D RoPE). Text
    takes (p, p, p): the same table entries as the 1-D position p."""
    rotary.enable_position_rows(1 + torch.arange(rotary.cos.shape[1] // 2) % 2)


def image_spans(input_ids: torch.Tensor, meta: Any, image_ids: torch.Tensor) -> list[ImageSpan]:
    """The runs (longer than one token) of image tokens among this step's prefill rows.
    A run that reaches the end of its chunk may go on in the next one, whose rows this
    one could not see: refused (serve image prompts without chunked prefill)."""
    flags = torch.isin(input_ids, image_ids).tolist()
    spans = []
    for seq in meta.prefills:
        i, end = seq.query_start, seq.query_start + seq.query_len
        while i < end:
            if not flags[i]:
                i += 1
                continue
            j = i
            while j < end and flags[j]:
                j += 1
            if j - i > 1:
                if j == end:
                    raise ValueError(
                        "max_num_batched_tokens: an input image's tokens were split across "
                        "prefill chunks; serve image prompts with enable_chunked_prefill off"
                    )
                keys = seq.context_len + j - seq.query_start
                spans.append(ImageSpan(i, j, keys, seq.block_ids))
            i = j
    return spans


class HunyuanImage3Model(nn.Module):
    """`model.*` of the checkpoint: token embedding, decoder layers, final norm."""

    def __init__(self, config: Any, dtype: torch.dtype, max_positions: int) -> None:
        super().__init__()
        rotary = RotaryEmbedding(DefaultRope(config), max_positions, dtype)
        enable_2d_rope(rotary)
        self.wte = Embedding(config.vocab_size, config.hidden_size, dtype)
        self.layers = nn.ModuleList(
            HunyuanDecoderLayer(config, i, dtype, rotary) for i in range(config.num_hidden_layers)
        )
        self.ln_f = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)


class HunyuanImage3ForCausalMM(CausalLM):
    architectures = ("HunyuanImage3ForCausalMM",)
    prefer_model_sampler = True
    supports_mrope = True
    """[3, T] (index, row, column) positions for prompts with images (`enable_2d_rope`)."""

    def __init__(self, config: Any, dtype: torch.dtype, max_positions: int) -> None:
        super().__init__()
        self.config = config
        self.dtype = dtype
        self.model = HunyuanImage3Model(config, dtype, max_positions)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, False, dtype)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if self.tie_word_embeddings:
            self.lm_head.weight = self.model.wte.weight
        attn = self.model.layers[0].self_attn
        self.num_layers = config.num_hidden_layers
        self.num_kv_heads = attn.num_kv_heads
        self.head_dim = attn.head_dim
        tokens = _tokens(config)
        self.sampler = HunyuanImage3Sampler(tokens)
        self.image_ids = torch.tensor([tokens.img, tokens.joint_img_sep])
        """The tokens of an input image's two runs and the separator between them."""

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.wte(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = self.model.wte(input_ids) if inputs_embeds is None else inputs_embeds
        spans = []
        if inputs_embeds is not None and positions.ndim == 2:  # a prompt with images
            spans = image_spans(input_ids, get_forward_context(), self.image_ids)
        for layer in self.model.layers:
            layer.self_attn.image_spans = spans
            x = layer(positions, x)
        return self.model.ln_f(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def sample(self, logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        return self.sampler(logits, metadata)

    def bind_kv_cache(self, kv_caches: list[torch.Tensor]) -> None:
        for layer, cache in zip(self.model.layers, kv_caches, strict=True):
            layer.self_attn.kv_cache = cache

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            if name.startswith(IMAGE_HEAD_PREFIXES) or "rotary_emb" in name:
                continue
            if name == "lm_head.weight" and self.tie_word_embeddings:
                continue
            if name not in params:
                raise ValueError(
                    f"checkpoint tensor {name!r} has no parameter in {type(self).__name__}"
                )
            param = params[name]
            if tensor.shape != param.shape:
                raise ValueError(
                    f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, "
                    f"expected {tuple(param.shape)}"
                )
            param.copy_(tensor.to(param.dtype))
            loaded.add(name)
        return loaded

    def expected_weight_names(self) -> set[str]:
        return {name for name, _ in self.named_parameters()}


def _tokens(config: Any) -> HunyuanTokens:
    """The sampler's token ids, from the tokenizer next to the checkpoint's config."""
    path = getattr(config, "_name_or_path", "") or ""
    return HunyuanTokens.from_checkpoint(path, config.image_base_size, first_eos(config))
