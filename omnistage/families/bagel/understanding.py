"""Bagel's understanding expert on the autoregressive hot path, and the KV rows it hands off.

The AR stage of the Bagel pipeline runs the language model's understanding expert
(Qwen2 with biases on q/k/v and RMSNorm on q and k per head: our `Qwen2ForCausalLM`
with `qk_norm`) over the prompt, in our engine (paged KV cache, continuous batching,
sync or async scheduling). Its weights are the `language_model.` ones of Bagel's
`ema.safetensors` without the generation expert's (`*_moe_gen`).

**Input images.** An image enters Bagel's context as blocks (`image_input.py`): every
token of a block at one RoPE position, attending to the whole block (not causal), VAE
tokens through the generation expert — none of which a causal, one-expert paged
attention computes. So the stage's prompter (`image_prompt.BagelImagePrompter`)
prefills the image blocks with the MoT once per request, and the prompt carries their
keys and values: its image positions hold placeholder ids, and the multimodal decoder
inputs the runner already moves with a request (`MultimodalDecoderInputs`) give
`visual_pos_mask` = the block positions, `deepstack_embeds` = their KV rows (layer `l`'s
row in `deepstack_embeds[l]`, zero-padded to the hidden width) and
`mrope_positions` = the RoPE position of every prompt token (equal rows; a block shares
one). `forward` uses the first row of the positions and, at each layer, replaces the
keys and values of those positions by the given ones before they are written to the
cache and attended to: the text after the images attends to exactly the reference's
image context, the cache holds it, and the hand-off reads it back like any other row.
(The deepstack channel is the runner's per-layer, per-visual-position transport; here
it carries KV rows instead of features added to hidden states.)

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

from omnistage.families.llama.model import DecoderAttention, Qwen2ForCausalLM
from omnistage.layers.forward_context import get_forward_context
from omnistage.models.base import DeepstackRows

MODEL_TYPE = "bagel_understanding"
ARCHITECTURE = "OmnistageBagelUnderstanding"
PREFIX = "language_model."


class BagelUnderstandingConfig(Qwen2Config):
    """`llm_config.json` as the config of the understanding stage (its own model type, so
    the registry finds its prompter)."""

    model_type = MODEL_TYPE


class InjectedKVAttention(DecoderAttention):
    """Qwen2 attention whose keys and values at some rows of the step are given
    (`injected`: rows, keys, values), not computed; on the torch path for every row, so a
    text row's keys do not depend on whether image rows share its step."""

    c_kernels = False
    injected: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def keys_and_values(
        self, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.injected is None:
            return k, v
        rows, keys, values = self.injected
        k, v = k.clone(), v.clone()
        k[rows], v[rows] = keys.to(k.dtype), values.to(v.dtype)
        return k, v


class BagelUnderstanding(Qwen2ForCausalLM):
    architectures = (ARCHITECTURE,)
    qk_norm = True
    supports_mrope = True
    supports_deepstack = True

    def __init__(self, config: Any, dtype: torch.dtype, max_positions: int) -> None:
        super().__init__(config, dtype, max_positions)
        for layer in self.layers:  # same weights and arithmetic, plus the injected rows
            layer.self_attn.__class__ = InjectedKVAttention
        self._slots: torch.Tensor | None = None

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
        deepstack: DeepstackRows | None = None,
    ) -> torch.Tensor:
        """Qwen2's forward; `positions` may be `[3, T]` (equal rows: Bagel's RoPE is 1-D),
        `deepstack` the KV rows of image positions (see the module docstring)."""
        self._slots = get_forward_context().slot_mapping
        if positions.ndim == 2:
            positions = positions[0]
        width = self.num_kv_heads * self.head_dim
        for i, layer in enumerate(self.layers):
            injected = None
            if deepstack is not None:
                rows = deepstack.embeds[i, :, : 2 * width]
                shape = (-1, self.num_kv_heads, self.head_dim)
                injected = (
                    deepstack.rows,
                    rows[:, :width].view(shape),
                    rows[:, width:].view(shape),
                )
            layer.self_attn.injected = injected
        try:
            return super().forward(input_ids, positions, inputs_embeds)
        finally:
            for layer in self.layers:
                layer.self_attn.injected = None

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
