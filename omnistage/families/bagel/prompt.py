"""`BagelPrompter`: a text-to-image request as Bagel's understanding expert reads it.

As the reference's `prepare_prompts`: `<|im_start|>` + the prompt's tokens +
`<|im_end|>`, no chat template and no system prompt. How much the stage writes is the
request's `max_tokens` over the deploy's default (1: what the denoising stage needs is
the prompt's KV cache, which exists once the prompt is prefilled).

A request with images (before its text, as the reference's `[image, text]`) is an edit
when it goes on to the draw stage (`send_to` names an edge: VAE and ViT blocks) and an
understanding question when it ends here (ViT blocks, then the answer's start token; its
answer stops at `<|im_end|>`); `image_prompt.py` lays it out, with the full Bagel model
loaded on the first such request. With `model_options={"think": True}` the stage thinks
first (`thinking.py`): its prompt is the system and prompt blocks and the thinking's start,
and it writes up to `<|im_end|>`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from omnistage.core.stage_input import StageInput, TokenBudget
from omnistage.core.tensor_blob import blob_to_tensor
from omnistage.families.bagel.config import SPECIAL_TOKENS
from omnistage.families.bagel.thinking import (
    MAX_THINK_TOKENS,
    OPTIONS,
    read_think,
    think_prompt_ids,
)

MAX_IMAGES = 4
MAX_ANSWER_TOKENS = 256
"""An understanding answer's length when the request names none."""


class BagelPrompter:
    reads_model_options = True
    """`think` (`thinking.read_think`); the stage refuses model options of other models."""
    model_options = OPTIONS
    """The option names it reads (the server routes a request's `extra_args` by them)."""

    def __init__(self, tokenizer: Any, path: Path | None = None, dtype: Any = None) -> None:
        self.tokenizer = tokenizer
        self.bos = tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS[0])
        self.eos = tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS[1])
        self.path = path
        self.dtype = dtype or torch.float32
        self._model: Any = None

    def image_model(self) -> Any:
        """The whole Bagel model (vision, VAE, both experts), loaded on first use."""
        if self._model is None:
            from omnistage.families.bagel.text_to_image import BagelImageModel

            if self.path is None:
                raise ValueError("images: this prompter has no checkpoint to encode images with")
            self._model = BagelImageModel(self.path, self.dtype)
        return self._model

    @classmethod
    def from_checkpoint(
        cls, path: str | Path, processor_path: str | Path | None = None, dtype: Any = None
    ) -> BagelPrompter:
        from transformers import AutoTokenizer

        from omnistage.families.bagel.understanding import BagelUnderstandingConfig

        config = BagelUnderstandingConfig.from_json_file(str(Path(path) / "config.json"))
        tokenizer = AutoTokenizer.from_pretrained(str(path), config=config, local_files_only=True)
        return cls(tokenizer, Path(path), dtype)

    def prompt_ids(self, prompt: str) -> list[int]:
        return [self.bos, *self.tokenizer.encode(prompt, add_special_tokens=False), self.eos]

    def request_input(self, stage: str, msg: Any) -> tuple[StageInput, TokenBudget | None]:
        """The stage input of a request (`SubmitRequest`); ValueError naming the field for
        Bagel cannot serve."""
        if not isinstance(msg.prompt, str) or not msg.prompt:
            raise ValueError(f"prompt: stage {stage!r} (Bagel) needs a non-empty text prompt")
        ids = self.prompt_ids(msg.prompt)
        understanding = msg.send_to == []
        budget = None
        if understanding:  # the answer ends at <|im_end|>, as the reference's gen_text
            budget = TokenBudget(_max_tokens(msg), stop_token_ids=(self.eos,))
        if read_think((msg.sampling or {}).get("model_options")):
            if msg.images:
                raise ValueError("think: thinking before an edit or about an image is not served")
            ids = think_prompt_ids(self.prompt_ids, msg.prompt, understanding)
            budget = TokenBudget(_max_tokens(msg, MAX_THINK_TOKENS), stop_token_ids=(self.eos,))
            return StageInput(prompt=msg.prompt, prompt_token_ids=ids), budget
        if not msg.images:
            ids = [*ids, self.bos] if understanding else ids
            return StageInput(prompt=msg.prompt, prompt_token_ids=ids), budget
        if len(msg.images) > MAX_IMAGES:
            raise ValueError(f"images: {len(msg.images)} images; Bagel takes at most {MAX_IMAGES}")
        from omnistage.families.bagel.image_prompt import image_prompt

        images = [blob_to_tensor(blob).numpy() for blob in msg.images]
        ids, inputs = image_prompt(self.image_model(), images, ids, understanding)
        return StageInput(prompt=msg.prompt, prompt_token_ids=ids, mm_decoder_inputs=inputs), budget


def _max_tokens(msg: Any, default: int = MAX_ANSWER_TOKENS) -> int:
    value = (msg.sampling or {}).get("max_tokens")
    return default if value is None else int(value)
