"""`BagelPrompter`: a text-to-image request as Bagel's understanding expert reads it.

As the reference's `prepare_prompts`: `<|im_start|>` + the prompt's tokens +
`<|im_end|>`, no chat template and no system prompt. How much the stage writes is the
request's `max_tokens` over the deploy's default (1: what the denoising stage needs is
the prompt's KV cache, which exists once the prompt is prefilled). Image input
(editing, understanding) is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnistage.core.stage_input import StageInput, TokenBudget
from omnistage.families.bagel.config import SPECIAL_TOKENS


class BagelPrompter:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.bos = tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS[0])
        self.eos = tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS[1])

    @classmethod
    def from_checkpoint(
        cls, path: str | Path, processor_path: str | Path | None = None, dtype: Any = None
    ) -> BagelPrompter:
        from transformers import AutoTokenizer

        from omnistage.families.bagel.understanding import BagelUnderstandingConfig

        config = BagelUnderstandingConfig.from_json_file(str(Path(path) / "config.json"))
        return cls(AutoTokenizer.from_pretrained(str(path), config=config, local_files_only=True))

    def prompt_ids(self, prompt: str) -> list[int]:
        return [self.bos, *self.tokenizer.encode(prompt, add_special_tokens=False), self.eos]

    def request_input(self, stage: str, msg: Any) -> tuple[StageInput, TokenBudget | None]:
        """The stage input of a request (`SubmitRequest`); ValueError naming the field for
        one Bagel's text-to-image path cannot serve."""
        if msg.images:
            raise ValueError(f"images: stage {stage!r} (Bagel) does not take input images yet")
        if not isinstance(msg.prompt, str) or not msg.prompt:
            raise ValueError(f"prompt: stage {stage!r} (Bagel) needs a non-empty text prompt")
        ids = self.prompt_ids(msg.prompt)
        return StageInput(prompt=msg.prompt, prompt_token_ids=ids), None
