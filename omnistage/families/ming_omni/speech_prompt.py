"""Ming-Omni's talker speaking a text without the thinker: the entry stage of the
talker-only deploys (`ming-omni-tts`, `demo-ming-omni-tts`: talker -> vocoder) renders
its own prompt from the request (`/v1/audio/speech`, `Omni.generate`).

As the reference's `omni_tts_binary_generation(tts_text, vp_emb, thinker_reply_part=None)`
(inclusionAI/Ming `modeling_bailing_talker.py`, commit 4876ed4): the prompt is the thinker
path's with no thinker rows, `<prompt> </prompt> <thinker_prefix> </thinker_prefix> <vp>
<audio_pad> </vp> <audio_bos>` (text side: the text's first id last), the speaker row at
the `<audio_pad>` inside `<vp> </vp>`, then one text id per step (the rest of the text,
`<text_eos>`, then `<text_pad>`); every prompt position at `P - 1` (see `prompt.py`,
which builds both).

The text is the request's prompt as it is (no chat template), tokenized by the talker's
tokenizer. Voices: the checkpoint's `talker/spks/*.pt` (the ar stage resolves the name);
`instructions` and a `language` other than "auto" are refused by name: the reference has
neither.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from omnistage.core.edge_processor import talker_stage_input
from omnistage.core.stage_input import StageInput, TokenBudget
from omnistage.families.ming_omni.prompt import DEFAULT_SPEAKER, MingTalkerPrompter

MAX_TEXT_TOKENS = 4096


class MingSpeechPrompter:
    """The talker's input for a text to speak (see the module docstring)."""

    def __init__(self, talker: MingTalkerPrompter) -> None:
        self.talker = talker

    @classmethod
    def from_checkpoint(cls, path: str | Path, dtype: torch.dtype = torch.float32) -> Any:
        return cls(MingTalkerPrompter.from_checkpoint(path, dtype))

    def text_ids(self, text: Any) -> list[int]:
        """The talker tokenizer's ids of `text` (ValueError naming `input`)."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError("input: the text to speak is empty")
        ids = list(self.talker.talker_tok.encode(text, add_special_tokens=False))
        if len(ids) > MAX_TEXT_TOKENS:
            raise ValueError(f"input: {len(ids)} tokens, over {MAX_TEXT_TOKENS}")
        return ids

    def request_input(self, stage: str, msg: Any) -> tuple[StageInput, TokenBudget | None]:
        """The talker's input for a request (`SubmitRequest`: prompt = the text, voice), and
        no token budget of its own."""
        if getattr(msg, "instructions", None):
            raise ValueError("instructions: Ming-Omni's talker takes no instructions")
        language = getattr(msg, "language", None)
        if language not in (None, "auto", "Auto"):
            raise ValueError(f"language: Ming-Omni's talker takes none ({language!r} given)")
        text = self.text_ids(msg.prompt)
        talker = self.talker.talker_input(text, None, msg.voice or DEFAULT_SPEAKER)
        return talker_stage_input(talker), None
