"""Ming-flash-omni-2.0's talker speaking a text without the thinker: the entry stage of
the talker-only deploys (`ming-flash-omni-tts`, `demo-ming-flash-omni-tts`: talker ->
audio VAE) renders its own prompt from the request (`/v1/audio/speech`, `Omni.generate`).
It is declared for the part `tts_talker` (the talker's weights under another part name),
not `talker`, whose input in the omni deploy is the prompt the thinker's edge builds.

As the reference's text-to-speech entry (inclusionAI/Ming-omni-tts `modeling_bailingmm.py`,
`prepare_input_embed(prompt, text)` then `sample`, with no speaker embedding, no
instruction and no prompt voice): the prompt is the one the reply path lays out
(`talker_prompt.talker_prompt_ids`, the speech task line and the text), so the text alone
is spoken exactly as a thinker's reply would be.

The text is the request's prompt as it is (no chat template), tokenized by the
checkpoint's tokenizer. Voices: the reference's talker without a speaker-embedding
extractor speaks in its one default voice, so a pipeline served by this prompter has no
named voices (any `voice` but the default is refused by name before a stage runs);
`instructions` and a `language` other than "auto" are refused by name: no instruction is
built here, and the reference takes no language.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from omnistage.core.stage_input import StageInput, TokenBudget
from omnistage.families.ming_flash_omni.talker_prompt import talker_prompt_ids

MAX_TEXT_TOKENS = 4096


class MingFlashSpeechPrompter:
    """The talker's input for a text to speak (see the module docstring)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def from_checkpoint(cls, path: str | Path, dtype: torch.dtype = torch.float32) -> Any:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(path), local_files_only=True))

    def prompt_ids(self, text: Any) -> list[int]:
        """The talker's prompt ids for `text` (ValueError naming `input`)."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError("input: the text to speak is empty")
        n = len(self.tokenizer.encode(text))
        if n > MAX_TEXT_TOKENS:
            raise ValueError(f"input: {n} tokens, over {MAX_TEXT_TOKENS}")
        return talker_prompt_ids(self.tokenizer, text)

    def request_input(self, stage: str, msg: Any) -> tuple[StageInput, TokenBudget | None]:
        """The talker's input for a request (`SubmitRequest`: prompt = the text), and no
        token budget of its own."""
        if getattr(msg, "instructions", None):
            raise ValueError("instructions: Ming-flash-omni's talker takes none here")
        language = getattr(msg, "language", None)
        if language not in (None, "auto", "Auto"):
            raise ValueError(f"language: Ming-flash-omni's talker takes none ({language!r} given)")
        if getattr(msg, "voice", None) is not None:
            raise ValueError(f"voice: {msg.voice!r}: this talker speaks its default voice only")
        return StageInput(prompt_token_ids=self.prompt_ids(msg.prompt)), None
