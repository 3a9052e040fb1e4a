"""Qwen3-Omni's thinker and talker as parts of the real checkpoint, on our hot path.

The **thinker** is the MoE text decoder; as a pipeline stage it also sends the
talker what transformers' `generate` hands it: per computed position, the input
embedding (`hidden_states[0]`) and the output of layer `accept_hidden_layer`,
side by side in one row (`hidden_output_layers`).

The **talker** generates one frame of speech codes per step
(docs/qwen3_omni_reference.md §3-4):

- its decoder (MoE + gated shared expert per layer) samples the frame's first
  code from `codec_head`, with the top 1024 ids but `codec_eos` suppressed;
- the code predictor (a small dense decoder with a fresh cache per frame) then
  writes the other `num_code_groups - 1` codes, from the decoder's final hidden
  state and the first code's embedding; both happen in `sample()`, so the
  runner keeps all codes of each frame in the request's history
  (`num_token_codes`);
- a frame fed back is embedded as the sum of its codes' embeddings
  (`embed_token_codes`), plus one projected thinker text row per step, which
  arrives as a conditioning row (see `qwen3_omni_talker_prompt.py`).

Sampling is seeded per request and output position, as the default sampler's:
the first code with the request's parameters (temperature 0 = greedy), the
code predictor's codes greedy for greedy requests, else with top-k 50, top-p
0.8, temperature 1 (transformers' defaults for it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.qwen_moe.model import Qwen3MoeForCausalLM, Qwen3OmniTalkerDecoder
from omnistage.layers.linear import Embedding, Linear
from omnistage.layers.norm import RMSNorm
from omnistage.layers.rotary import RotaryEmbedding, rotate
from omnistage.models.base import DeepstackRows
from omnistage.models.parts import ROOT_CONFIG_ATTR
from omnistage.sample import Sampler, SamplingMetadata
from omnistage.sample.metadata import SAMPLING_EPS, RowSamplingState
from omnistage.sampling_params import SamplingParams

NUM_SUPPRESSED = 1024
"""The top ids of the talker vocabulary `generate` never samples (but `codec_eos`)."""

_CODE_PREDICTOR_PARAMS = SamplingParams(temperature=1.0, top_k=50, top_p=0.8)
_GREEDY = SamplingParams(temperature=0.0)
_SEED_SALT = 0x636F64655F707265  # separates the code predictor's draws from the talker's


def root_config(config: Any) -> Any:
    root = getattr(config, ROOT_CONFIG_ATTR, None)
    if root is None:
        raise ValueError(
            f"{type(config).__name__}: a Qwen3-Omni part needs the whole checkpoint's config "
            "(load it with model_part=...)"
        )
    return root


class Qwen3OmniThinker(Qwen3MoeForCausalLM):
    """The thinker's text decoder. Requests with images bring 3-D positions, rotated with
    interleaved multimodal RoPE (`mrope_section` of the text config's `rope_parameters`),
    and deepstack features, added after the first decoder layers at their visual rows
    (`Qwen3OmniMoeThinkerTextModel._deepstack_process`); the hidden states sent to the
    talker are taken before that addition, as transformers records them."""

    llama_default_rope = False  # its rotary is the omni (multimodal) one

    architectures = ("OmnistageQwen3OmniThinker",)
    supports_mrope = True
    supports_deepstack = True

    def __init__(self, config: Any, dtype: torch.dtype, max_positions: int) -> None:
        super().__init__(config, dtype, max_positions)
        accept = root_config(config).talker_config.accept_hidden_layer
        self.hidden_output_layers = (0, accept)
        rope = getattr(config, "rope_parameters", None) or {}
        section = list(rope.get("mrope_section", [24, 20, 20]))  # transformers' default
        self.layers[0].self_attn.rotary.enable_mrope(section, interleaved=True)

    @staticmethod
    def _hf_rotary(config: Any) -> nn.Module:
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
            Qwen3OmniMoeThinkerTextRotaryEmbedding,
        )

        return Qwen3OmniMoeThinkerTextRotaryEmbedding(config)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
        deepstack: DeepstackRows | None = None,
    ) -> torch.Tensor:
        if deepstack is None:
            return super().forward(input_ids, positions, inputs_embeds)
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        wanted, captured = self.hidden_output_layers, {}
        num_layers = len(self.layers)
        if 0 in wanted:
            captured[0] = x
        for i, layer in enumerate(self.layers):
            x = layer(positions, x)
            if i + 1 in wanted and i + 1 < num_layers:
                captured[i + 1] = x
            if i < deepstack.embeds.shape[0]:
                # Out of place: a captured output keeps the layer's own value.
                x = x.index_add(0, deepstack.rows, deepstack.embeds[i])
        out = self.norm(x)
        if wanted:
            captured[num_layers] = out
            self._captured = torch.cat([captured[i] for i in wanted], dim=-1)
        return out


class CodePredictorLayer(nn.Module):
    """A dense Qwen3 decoder layer (q/k norm, RoPE) over a short per-frame sequence."""

    def __init__(self, config: Any, dtype: torch.dtype) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or hidden // self.num_heads
        bias = getattr(config, "attention_bias", False)
        self.self_attn = nn.Module()
        attn = self.self_attn
        attn.q_proj = Linear(hidden, self.num_heads * self.head_dim, bias, dtype=dtype)
        attn.k_proj = Linear(hidden, self.num_kv_heads * self.head_dim, bias, dtype=dtype)
        attn.v_proj = Linear(hidden, self.num_kv_heads * self.head_dim, bias, dtype=dtype)
        attn.o_proj = Linear(self.num_heads * self.head_dim, hidden, bias, dtype=dtype)
        attn.q_norm = RMSNorm(self.head_dim, eps, dtype)
        attn.k_norm = RMSNorm(self.head_dim, eps, dtype)
        self.mlp = nn.Module()
        self.mlp.gate_proj = Linear(hidden, config.intermediate_size, False, dtype=dtype)
        self.mlp.up_proj = Linear(hidden, config.intermediate_size, False, dtype=dtype)
        self.mlp.down_proj = Linear(config.intermediate_size, hidden, False, dtype=dtype)
        self.input_layernorm = RMSNorm(hidden, eps, dtype)
        self.post_attention_layernorm = RMSNorm(hidden, eps, dtype)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: list[torch.Tensor],
    ) -> torch.Tensor:
        """x [B, T, H]; cos/sin [T, d]; `cache` ([k, v] of the earlier positions, or empty)
        is extended in place."""
        b, t, _ = x.shape
        attn = self.self_attn
        h = self.input_layernorm(x)
        q = attn.q_norm(attn.q_proj(h).view(b, t, self.num_heads, self.head_dim))
        k = attn.k_norm(attn.k_proj(h).view(b, t, self.num_kv_heads, self.head_dim))
        v = attn.v_proj(h).view(b, t, self.num_kv_heads, self.head_dim)
        cos, sin = cos[None, :, None], sin[None, :, None]
        q, k = rotate(q, cos, sin).transpose(1, 2), rotate(k, cos, sin).transpose(1, 2)
        v = v.transpose(1, 2)
        if cache:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        cache[:] = [k, v]
        out = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1, enable_gqa=True)
        x = x + attn.o_proj(out.transpose(1, 2).reshape(b, t, -1))
        h = self.post_attention_layernorm(x)
        mlp = self.mlp
        return x + mlp.down_proj(F.silu(mlp.gate_proj(h)) * mlp.up_proj(h))


class CodePredictor(nn.Module):
    """`talker.code_predictor`: writes a frame's codes 1..G-1 from the talker's state."""

    def __init__(self, config: Any, dtype: torch.dtype) -> None:
        super().__init__()
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
            Qwen3OmniMoeRotaryEmbedding,
        )

        groups = config.num_code_groups
        self.num_codes = groups - 1
        self.model = nn.Module()
        self.model.layers = nn.ModuleList(
            CodePredictorLayer(config, dtype) for _ in range(config.num_hidden_layers)
        )
        self.model.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.model.codec_embedding = nn.ModuleList(
            Embedding(config.vocab_size, config.hidden_size, dtype=dtype)
            for _ in range(self.num_codes)
        )
        self.lm_head = nn.ModuleList(
            Linear(config.hidden_size, config.vocab_size, False, dtype=dtype)
            for _ in range(self.num_codes)
        )
        self.rotary = RotaryEmbedding(Qwen3OmniMoeRotaryEmbedding(config), groups + 1, dtype)
        self.requires_grad_(False)

    def embed(self, codes: torch.Tensor) -> torch.Tensor:
        """[n, G-1] codes 1..G-1 -> the sum of their embeddings [n, H]."""
        tables = self.model.codec_embedding
        out = tables[0](codes[:, 0])
        for j in range(1, self.num_codes):
            out = out + tables[j](codes[:, j])
        return out

    def generate(
        self,
        talker_hidden: torch.Tensor,
        first_code_embeds: torch.Tensor,
        sample: Any,
    ) -> torch.Tensor:
        """[B, H] talker hidden and first-code embeddings -> [B, G-1] codes; `sample(j,
        logits)` picks code j+1 of every row."""
        x = torch.stack([talker_hidden, first_code_embeds], dim=1)
        caches: list[list[torch.Tensor]] = [[] for _ in self.model.layers]
        start, codes = 0, []
        for j in range(self.num_codes):
            t = x.shape[1]
            cos, sin = self.rotary.cos[start : start + t], self.rotary.sin[start : start + t]
            for layer, cache in zip(self.model.layers, caches, strict=True):
                x = layer(x, cos, sin, cache)
            start += t
            logits = self.lm_head[j](self.model.norm(x[:, -1])).float()
            code = sample(j, logits)
            codes.append(code)
            if j + 1 < self.num_codes:
                x = self.model.codec_embedding[j](code)[:, None]
        return torch.stack(codes, dim=1)


class Qwen3OmniTalker(Qwen3OmniTalkerDecoder):
    """The talker stage's model: decoder, code predictor and the talker's own sampling.

    Prompts from image questions come with 3-D positions (`Qwen3OmniTalkerPrompter`),
    rotated with interleaved multimodal RoPE as the thinker's; the talker has no
    deepstack (transformers' `generate` gives its talker none)."""

    architectures = ("OmnistageQwen3OmniTalker",)
    prefer_model_sampler = True
    supports_mrope = True

    def __init__(self, config: Any, dtype: torch.dtype, max_positions: int) -> None:
        super().__init__(config, dtype, max_positions)
        rope = getattr(config, "rope_parameters", None) or {}
        section = list(rope.get("mrope_section", [24, 20, 20]))  # transformers' default
        # transformers' talker rotary is the thinker's: always interleaved.
        self.layers[0].self_attn.rotary.enable_mrope(section, interleaved=True)
        talker = root_config(config).talker_config
        self.codec_eos_token_id = talker.codec_eos_token_id
        self.code_predictor = CodePredictor(talker.code_predictor_config, dtype)
        self.num_token_codes = self.code_predictor.num_codes
        suppressed = torch.zeros(config.vocab_size, dtype=torch.bool)
        suppressed[config.vocab_size - NUM_SUPPRESSED :] = True
        suppressed[self.codec_eos_token_id] = False
        self.register_buffer("suppressed", suppressed, persistent=False)
        self._sampler = Sampler()
        self._sampling_hidden: torch.Tensor | None = None

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        self._sampling_hidden = hidden  # read by sample(), which the runner calls next
        return super().compute_logits(hidden)

    def embed_token_codes(self, codes: torch.Tensor) -> torch.Tensor:
        return self.code_predictor.embed(codes)

    def sample(self, logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        hidden, self._sampling_hidden = self._sampling_hidden, None
        if hidden is None or hidden.shape[0] != logits.shape[0]:
            raise RuntimeError("Qwen3OmniTalker.sample: compute_logits was not called first")
        logits = logits.masked_fill(self.suppressed.to(logits.device), float("-inf"))
        first = self._sampler(logits, metadata)
        residual_md = _code_predictor_metadata(metadata, self.num_token_codes, logits.device)
        residual = self.code_predictor.generate(
            hidden,
            self.embed_tokens(first),
            lambda j, lg: self._sampler(lg, residual_md[j]),
        )
        return torch.cat([first[:, None], residual], dim=1)

    # -- weights ------------------------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        own: dict[str, torch.Tensor] = {}

        def decoder(items: Iterable[tuple[str, torch.Tensor]]):
            for name, tensor in items:
                if name.startswith("code_predictor."):
                    own[name.removeprefix("code_predictor.")] = tensor
                else:
                    yield name, tensor

        loaded = super().load_weights(decoder(weights))
        state = self.code_predictor.state_dict()
        for name, tensor in own.items():
            if name not in state or state[name].shape != tensor.shape:
                raise ValueError(f"checkpoint tensor talker.code_predictor.{name} does not fit")
            state[name].copy_(tensor.to(self.dtype))
            loaded.add(f"code_predictor.{name}")
        return loaded

    def expected_weight_names(self) -> set[str]:
        names = {n for n in super().expected_weight_names() if "code_predictor." not in n}
        return names | {f"code_predictor.{n}" for n in self.code_predictor.state_dict()}


def _code_predictor_metadata(
    md: SamplingMetadata, num_codes: int, device: torch.device
) -> list[SamplingMetadata]:
    """Per code index: the metadata of its draws (greedy rows stay greedy; random rows use
    the code predictor's parameters, seeded by the request and (output position, code))."""
    rows = [
        RowSamplingState(
            sampling_params=_GREEDY if p.temperature < SAMPLING_EPS else _CODE_PREDICTOR_PARAMS,
            seed=(seed ^ _SEED_SALT) & ((1 << 63) - 1),
            prompt_token_ids=[],
            output_token_ids=[],
        )
        for p, seed in zip(md.sampling_params, md.seeds, strict=True)
    ]
    first = SamplingMetadata.from_requests(rows, device)
    # The draws of code j differ only in their position: the rest is built once per step.
    return [
        dataclasses.replace(
            first, output_positions=[pos * num_codes + j for pos in md.output_positions]
        )
        for j in range(num_codes)
    ]
