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

Sampling: `code_predictor.CodePredictingTalker` (the code predictor's draws use
top-k 50, top-p 0.8, temperature 1, transformers' defaults for it).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from omnistage.families.qwen3_omni.code_predictor import CodePredictingTalker, CodePredictor
from omnistage.families.qwen_moe.model import Qwen3MoeForCausalLM, Qwen3OmniTalkerDecoder
from omnistage.layers.rotary import DefaultRope
from omnistage.models.base import DeepstackRows
from omnistage.models.parts import ROOT_CONFIG_ATTR
from omnistage.sampling_params import SamplingParams


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


class Qwen3OmniTalker(CodePredictingTalker, Qwen3OmniTalkerDecoder):
    """The talker stage's model: decoder, code predictor and the talker's own sampling
    (`code_predictor.CodePredictingTalker`).

    Prompts from image questions come with 3-D positions (`Qwen3OmniTalkerPrompter`),
    rotated with interleaved multimodal RoPE as the thinker's; the talker has no
    deepstack (transformers' `generate` gives its talker none)."""

    architectures = ("OmnistageQwen3OmniTalker",)
    supports_mrope = True
    code_predictor_params = SamplingParams(temperature=1.0, top_k=50, top_p=0.8)
    """transformers' defaults for Qwen3-Omni's code predictor."""

    def __init__(self, config: Any, dtype: torch.dtype, max_positions: int) -> None:
        super().__init__(config, dtype, max_positions)
        rope = getattr(config, "rope_parameters", None) or {}
        section = list(rope.get("mrope_section", [24, 20, 20]))  # transformers' default
        # transformers' talker rotary is the thinker's: always interleaved.
        self.layers[0].self_attn.rotary.enable_mrope(section, interleaved=True)
        talker = root_config(config).talker_config
        predictor_config = talker.code_predictor_config
        predictor = CodePredictor(predictor_config, dtype, _predictor_rotary(predictor_config))
        self.init_talker(predictor, config.vocab_size, talker.codec_eos_token_id)


def _predictor_rotary(config: Any) -> Any:
    """The code predictor's rotary frequencies: `DefaultRope` where its config asks for plain
    RoPE (the same frequencies as transformers' `Qwen3OmniMoeRotaryEmbedding`, tested,
    without importing the whole of transformers' Qwen3-Omni model code), else that class."""
    if DefaultRope.applies_to(config):
        return DefaultRope(config)
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        Qwen3OmniMoeRotaryEmbedding,
    )

    return Qwen3OmniMoeRotaryEmbedding(config)
