"""Ming-Omni's thinker -> talker edge, on the common data plane.

The reference hands its talker the thinker's prompt rows and reply text in-process
(vLLM-Omni's seed keeps this "group A" conditioning on a path of its own); here they
travel as every omni family's do: the thinker's runner collects `ids.prompt`,
`ids.output` and `hidden_states.output` (CONCAT per step, through the accumulator) and
the connector delivers the payload when the thinker finishes; this processor turns it
into the talker's stage input (`prompt.MingTalkerPrompter`).

The whole payload, not a stream: the talker's text is the thinker's reply re-tokenized
by the talker tokenizer, which is only final once the reply is.
"""

from __future__ import annotations

from typing import Any

from omnistage.core.edge_processor import (
    Accumulate,
    EdgeProcessor,
    ThinkerToTalker,
    talker_stage_input,
)
from omnistage.core.payload import Payload
from omnistage.core.stage_input import StageInput
from omnistage.families.ming_omni.prompt import DEFAULT_SPEAKER


class MingThinkerToTalker(ThinkerToTalker):
    """Ming-Omni thinker -> talker: the talker's prompt (speech ids, embeddings with the
    projected thinker rows and the speaker row), one text row per step and the
    `<text_pad>` fill. The speaker is the request's voice, else "luna"."""

    name = "ming_omni_thinker_to_talker"
    stream_key = None

    def __init__(self) -> None:
        self.prompter: Any = None

    def bind_consumer(self, engine: Any) -> None:
        from omnistage.families.ming_omni.prompt import MingTalkerPrompter

        self.prompter = MingTalkerPrompter.from_checkpoint(
            engine.model_files.path, engine.config.torch_dtype
        )

    def to_input(self, payload: Payload, voice: str | None = None) -> StageInput:
        if self.prompter is None:
            raise ValueError(f"edge processor {self.name!r} feeds only an ar stage")
        talker = self.prompter.build(
            len(payload["ids.prompt"]),
            payload["ids.output"].tolist(),
            payload["hidden_states.output"],
            speaker=voice or DEFAULT_SPEAKER,
        )
        return talker_stage_input(talker)


class MingTalkerToVocoder(EdgeProcessor):
    """Ming-Omni talker -> vocoder: the talker's output ids (speech BPE ids, CONCAT per
    step) are the vocoder's input, as one whole payload at the talker's finish (the
    vocoder is not causal: see `token2wav`)."""

    name = "ming_omni_talker_to_vocoder"

    accumulate = {"ids.output": Accumulate.CONCAT}
    stream_key = "ids.output"
    input_key = "ids.output"
