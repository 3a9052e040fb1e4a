"""Qwen2.5-Omni's edge: the thinker's rows become its talker's input."""

from __future__ import annotations

from typing import Any

from omnistage.core.edge_processor import IMAGE_GRID_KEY, ThinkerToTalker, talker_stage_input
from omnistage.core.payload import Payload
from omnistage.core.stage_input import StageInput
from omnistage.families.qwen25_omni.voices import DEFAULT_VOICE


class Qwen25OmniThinkerToTalker(ThinkerToTalker):
    """Qwen2.5-Omni thinker -> talker: the talker's prompt (codec mask ids for the
    repetition penalty, thinker-width prompt embeddings with the speaker and codec rows),
    one conditioning row per reply token and the `tts_text_pad` fill, built from the
    thinker's prompt, reply and per-position (input embedding, final normed hidden) rows
    with the checkpoint's embeddings (`qwen25_talker_inputs`, `codec_rows=True`: the
    input transformers' talker builds whenever it is given an attention mask).

    For a prompt with images the thinker also sends their patch grids (`IMAGE_GRID_KEY`):
    the talker then rotates its prompt with 3-D positions (`get_rope_index` over its own
    input ids, as transformers' talker does given a mask).

    The speaker is the request's voice (`SubmitRequest.voice`, spelled as in `spk_dict.pt`),
    else the model's default ("Chelsie")."""

    name = "qwen25_omni_thinker_to_talker"

    def __init__(self) -> None:
        self.specials: Any = None

    def bind_consumer(self, engine: Any) -> None:
        from omnistage.families.qwen25_omni.model import Qwen25TalkerSpecials

        self.specials = Qwen25TalkerSpecials.from_checkpoint(
            engine.model_files.path, engine.config.torch_dtype
        )

    def to_input(self, payload: Payload, voice: str | None = None) -> StageInput:
        from omnistage.families.qwen25_omni.model import qwen25_talker_inputs

        if self.specials is None:
            raise ValueError(f"edge processor {self.name!r} feeds only an ar stage")
        rows = payload["hidden_states.output"]  # [positions, 2 H]: input embedding, hidden
        if rows.ndim != 2 or rows.shape[1] % 2:
            raise ValueError(
                f"{self.name}: expected [positions, 2 x thinker hidden] rows (input embedding, "
                f"final hidden state), got {list(rows.shape)}"
            )
        width = rows.shape[1] // 2
        talker = qwen25_talker_inputs(
            rows[:, :width],
            rows[:, width:],
            payload["ids.prompt"].tolist(),
            payload["ids.output"].tolist(),
            self.specials,
            speaker=voice or DEFAULT_VOICE,
            image_grid_thw=payload.get(IMAGE_GRID_KEY),
        )
        return talker_stage_input(talker)
