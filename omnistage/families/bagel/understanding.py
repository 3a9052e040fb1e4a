"""Bagel's understanding expert on the autoregressive hot path, and the KV rows it hands off.

The AR stage of the Bagel pipeline runs the language model's understanding expert
(Qwen2 with biases on q/k/v and RMSNorm on q and k per head: our `Qwen2ForCausalLM`
with `qk_norm`) over the prompt, in our engine (paged KV cache, continuous batching,
sync or async scheduling). Its weights are the `language_model.` ones of Bagel's
`ema.safetensors` without the generation expert's (`*_moe_gen`).

What it hands to the denoising stage is not a hidden state but the KV cache of the
positions it computed: `stage_hidden_states` returns, per position computed this step,
that position's keys and values of every layer as one row (`KVContext.to_rows` order),
read back from the paged cache at the slots the step wrote. The runner keeps only the
rows of positions computed for good, the accumulator collects them per request, and the
edge (`edges.BagelPromptKV`) passes exactly the prompt's rows on.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from transformers import Qwen2Config

from omnistage.families.llama.model import Qwen2ForCausalLM
from omnistage.layers.forward_context import get_forward_context

MODEL_TYPE = "bagel_understanding"
ARCHITECTURE = "OmnistageBagelUnderstanding"
PREFIX = "language_model."


class BagelUnderstandingConfig(Qwen2Config):
    """`llm_config.json` as the config of the understanding stage (its own model type, so
    the registry finds its prompter)."""

    model_type = MODEL_TYPE


class BagelUnderstanding(Qwen2ForCausalLM):
    architectures = (ARCHITECTURE,)
    qk_norm = True

    def __init__(self, config: Any, dtype: torch.dtype, max_positions: int) -> None:
        super().__init__(config, dtype, max_positions)
        self._slots: torch.Tensor | None = None

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        self._slots = get_forward_context().slot_mapping
        return super().forward(input_ids, positions, inputs_embeds)

    def stage_hidden_states(self, hidden: torch.Tensor) -> torch.Tensor:
        """`[positions, layers * 2 * kv_heads * head_dim]`: the keys and values this step
        wrote, one row per position (see the module docstring)."""
        slots = self._slots
        per_layer = []
        for layer in self.layers:
            cache = layer.self_attn.kv_cache
            _, kv_heads, blocks, block_size, head_dim = cache.shape
            flat = cache.view(2, kv_heads, blocks * block_size, head_dim)
            k = flat[0].index_select(1, slots).transpose(0, 1)
            v = flat[1].index_select(1, slots).transpose(0, 1)
            per_layer.append(torch.cat([k, v], dim=1))
        return torch.stack(per_layer, dim=1).reshape(slots.shape[0], -1)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Only the understanding expert's weights, `language_model.` stripped."""
        return super().load_weights(
            (name.removeprefix(PREFIX), tensor)
            for name, tensor in weights
            if name.startswith(PREFIX) and "_moe_gen" not in name
        )
