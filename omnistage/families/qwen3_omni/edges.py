"""Qwen3-Omni's edge: the thinker's rows become its talker's input."""

from __future__ import annotations

from typing import Any

import torch

from omnistage.core.edge_processor import IMAGE_GRID_KEY, ThinkerToTalker, talker_stage_input
from omnistage.core.payload import Payload
from omnistage.core.stage_input import StageInput
from omnistage.families.qwen3_omni.voices import DEFAULT_VOICE


class Qwen3OmniThinkerToTalker(ThinkerToTalker):
    """Qwen3-Omni thinker -> talker: the talker's prompt and per-frame text rows, built from
    the thinker's prompt, reply and per-position (input embedding, `accept_hidden_layer`
    output) rows by the talker checkpoint's projections (`Qwen3OmniTalkerPrompter`).

    For a prompt with images the thinker also sends their patch grids (`IMAGE_GRID_KEY`):
    the talker then rotates its prompt with 3-D positions (`get_rope_index` over its own
    input ids, as transformers' talker does).

    The speaker is the request's voice (`SubmitRequest.voice`, one of the checkpoint's
    `talker_config.speaker_id` keys), else the model's default ("ethan")."""

    name = "qwen3_omni_thinker_to_talker"

    def __init__(self) -> None:
        self.prompter: Any = None

    def bind_consumer(self, engine: Any) -> None:
        from omnistage.families.qwen3_omni.talker_prompt import Qwen3OmniTalkerPrompter

        self.prompter = Qwen3OmniTalkerPrompter.from_checkpoint(
            engine.model_files.path, engine.config.torch_dtype
        )

    def to_input(self, payload: Payload, voice: str | None = None) -> StageInput:
        if self.prompter is None:
            raise ValueError(f"edge processor {self.name!r} feeds only an ar stage")
        talker = self.prompter.build(
            payload["ids.prompt"].tolist(),
            payload["ids.output"].tolist(),
            payload["hidden_states.output"],
            speaker=voice or DEFAULT_VOICE,
            finished=bool(payload.get("meta.finished", True)),
            image_grid_thw=payload.get(IMAGE_GRID_KEY),
        )
        return talker_stage_input(talker)

    def to_conditioning(
        self, payload: Payload, last: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Streamed: each later thinker row is one more frame's text row; the last chunk
        adds `tts_eos`, then `tts_pad` for every later frame."""
        rows = payload.get("hidden_states.output")
        return self.prompter.text_rows(rows if rows is not None else torch.zeros(0, 0), last)
