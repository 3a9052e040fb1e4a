"""CosyVoice3's LM as a part of the converted checkpoint, on our hot path.

The reference's `CosyVoice3LM` is a Qwen2 decoder (`Qwen2Encoder`) read through its own
tables: the speech tokens' `speech_embedding` is its input embedding, `llm_decoder` its
head (no bias), over the 6561 speech tokens plus 200 special ids. The converted view
(`layout.py`) names them `model.embed_tokens` and `lm_head`, so this is our Qwen2 decoder
unchanged; the text embedding is the prompter's (`prompt.py`), not loaded here.

It samples as the reference does (`llm.sampling: ras_sampling`): repetition-aware
sampling over CosyVoice's nucleus (`sample/repetition_aware.py`), with the top-p and
top-k of each request's sampling parameters (the deploys' defaults: 0.8 and 25).
"""

from __future__ import annotations

import torch

from omnistage.families.llama.model import Qwen2ForCausalLM
from omnistage.sample.metadata import SamplingMetadata
from omnistage.sample.repetition_aware import RepetitionAwareSampler


class CosyVoice3LM(Qwen2ForCausalLM):
    architectures = ("OmnistageCosyVoice3LM",)
    prefer_model_sampler = True
    ras = RepetitionAwareSampler()
    """Stateless (every draw depends on the row's seed and position only): one for all."""

    def sample(self, logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        return self.ras(logits, metadata)
