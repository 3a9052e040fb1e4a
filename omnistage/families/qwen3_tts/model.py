"""Qwen3-TTS's talker as a part of the real checkpoint, on our hot path.

A dense Qwen3 decoder (q/k norm; plain RoPE for its text-only prompts, see
`config.py`) over codebook 0 of the 16-codebook 12.5 Hz codec: its input
embedding is `talker.model.codec_embedding`, its head `talker.codec_head`
(`models/parts.py` maps the names). Per step it samples a frame's first code, and
the code predictor writes the other 15 inside the same step, batched across
requests (`CodePredictingTalker`): 15 small sequential forwards per frame, with
no hand-off between stages. A frame fed back is embedded as the sum of its codes'
embeddings plus one text row (the request's conditioning: the next text token
while streaming text in, else `tts_pad`), which `prompt.Qwen3TTSPrompter` builds
with the talker's text embedding and projection (not loaded here).

Sampling follows the reference's defaults (`qwen_tts` 0.1.1 `generate`): the first
code with the request's parameters, the top 1024 ids but `codec_eos` never
sampled; codes 1..15 with top-k 50, top-p 1.0, temperature 0.9 (greedy for
greedy requests).
"""

from __future__ import annotations

from typing import Any

import torch

from omnistage.families.llama.model import Qwen3ForCausalLM
from omnistage.families.qwen3_omni.code_predictor import CodePredictingTalker, CodePredictor
from omnistage.layers.rotary import DefaultRope
from omnistage.sampling_params import SamplingParams

_TEXT_SIDE = "model.text_embedding."
"""The talker's text embedding is the prompter's (`prompt.py`), not the decoder's."""


class Qwen3TTSTalker(CodePredictingTalker, Qwen3ForCausalLM):
    architectures = ("OmnistageQwen3TTSTalker",)
    code_predictor_params = SamplingParams(temperature=0.9, top_k=50, top_p=1.0)

    def __init__(self, config: Any, dtype: torch.dtype, max_positions: int) -> None:
        super().__init__(config, dtype, max_positions)
        predictor_config = config.code_predictor_config
        predictor = CodePredictor(
            predictor_config, dtype, DefaultRope(predictor_config), config.hidden_size
        )
        self.init_talker(predictor, config.vocab_size, config.codec_eos_token_id)

    def weight_target(self, hf_name: str) -> tuple[str, int | None] | None:
        if hf_name.startswith(_TEXT_SIDE):
            return None
        return super().weight_target(hf_name)
