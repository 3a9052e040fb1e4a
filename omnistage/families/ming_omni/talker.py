"""Ming-Omni's talker decoder: the Qwen2 of `BailingTalkerForConditionalGeneration`.

Read from the reference `modeling_bailing_talker.py` (inclusionAI/Ming, Ming-omni). The
talker is a `Qwen2ForCausalLM` whose vocabulary is resized to `talker_config.vocab_size`
(text ids of the talker tokenizer, then the speech BPE ids at `len(tokenizer)` and up);
its head scores all of them, and it ends at the talker tokenizer's `<audio_eos>`. Each
position's input is the sum of two embeddings of that table: the speech id (the
`<audio_*>` prompt ids, then each sampled BPE id fed back) and a text id (the prompt's
text, then one text id of the reply per step). The prompt's thinker rows and the
speaker row replace the summed embeddings at their placeholders. All of that is built
by `prompt.MingTalkerPrompter` (the edge); this class is the decoder it feeds.

Positions: the reference hands `generate` the prompt's *last* position only
(`position_ids = (mask.cumsum(-1) - 1)[:, -1]`), which transformers' Qwen2 broadcasts
over every prompt position: the whole prompt is rotated by position `P - 1`, and decode
step s sits at `P + s`. The prompter reproduces that with explicit positions
(`MultimodalDecoderInputs`, three equal rows, so multimodal RoPE here is plain RoPE).
"""

from __future__ import annotations

from typing import Any

import torch

from omnistage.families.llama.model import Qwen2ForCausalLM


class MingTalker(Qwen2ForCausalLM):
    """The talker part of a Ming-Omni checkpoint (see the module docstring)."""

    architectures = ("OmnistageMingTalker",)
    supports_mrope = True

    def __init__(self, config: Any, dtype: torch.dtype, max_positions: int) -> None:
        super().__init__(config, dtype, max_positions)
        half = self.head_dim // 2
        third = half // 3
        # Three equal position rows: any split of the frequencies rotates the same.
        self.layers[0].self_attn.rotary.enable_mrope([half - 2 * third, third, third], False)
