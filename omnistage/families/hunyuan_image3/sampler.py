"""HunyuanImage-3's own sampler (`prefer_model_sampler`): forced sections, then the
default sampler.

On the logits of each row, from the row's real output history (DESIGN.md invariant 1;
seeds/000 is this sampler reading placeholders under async), or, before the first
output token, the prompt's last token (the `image` bot task's prompt ends with the size
token):

- `</think>` forces `<recaption>`; `</recaption>` forces `<answer> <boi>
  <img_size_{base}>` (the stage transitions of the reference's generation mode);
- right after the size token only the ratio tokens remain, and the most likely of
  them is taken (the reference's `_ConditionalSliceVocabLogitsProcessor`, greedy);
- right after a ratio token the answer ends (eos).

Then the default sampler draws (seeded per request and position), so a row that is
not forced samples exactly as without this sampler.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from omnistage.families.hunyuan_image3.tokens import HunyuanTokens
from omnistage.sample import Sampler, SamplingMetadata
from omnistage.sample.stage_transitions import StageTransitions


class HunyuanImage3Sampler:
    def __init__(self, tokens: HunyuanTokens) -> None:
        self.tokens = tokens
        self.transitions = StageTransitions(
            {
                (tokens.end_of_think,): (tokens.recaption,),
                (tokens.end_of_recaption,): (tokens.answer, tokens.boi, tokens.size),
            }
        )
        self.ratios = torch.tensor(tokens.ratios, dtype=torch.int64)
        self.ratio_set = frozenset(tokens.ratios)
        self.sampler = Sampler()

    def restrict(
        self,
        logits: torch.Tensor,
        histories: Sequence[Sequence[int]],
        prompts: Sequence[Sequence[int]] | None = None,
    ) -> None:
        """Force each row's next token where its history (or, with no output yet, its
        prompt's last token) says so, in place."""
        self.transitions.apply(logits, histories)
        for row, history in enumerate(histories):
            prompt = prompts[row] if prompts is not None else ()
            last = history[-1] if history else (prompt[-1] if len(prompt) else None)
            if last == self.tokens.size:
                ratios = self.ratios.to(logits.device)
                self._force(logits, row, int(ratios[logits[row, ratios].argmax()]))
            elif last in self.ratio_set:
                self._force(logits, row, self.tokens.eos)

    @staticmethod
    def _force(logits: torch.Tensor, row: int, token: int) -> None:
        logits[row].fill_(float("-inf"))
        logits[row, token] = 0.0

    def __call__(self, logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        self.restrict(logits, metadata.output_token_ids, metadata.prompt_token_ids)
        return self.sampler(logits, metadata)
