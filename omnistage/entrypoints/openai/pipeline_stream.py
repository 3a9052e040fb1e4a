"""`PipelineStream`: one pipeline request's `OmniRequestOutput` updates as `RequestDelta`s
(a `client.DeltaStream`), so the one chat and completion handlers serve pipelines.

The text stage's updates become one sequence (index 0): its new text with the
tokens written since the last piece of text (an update with tokens but no text
yet is folded into the next one, so a stream sends no empty chunks), and on the
last update the finish reason ("stop" where the stage gave none). The audio
stage's new samples ride in `RequestDelta.audio`; the first of them is the
request's time to first audio (`observer.on_first_audio`), or, where the audio
came whole, its end. The image stage's picture (`[H, W, 3]` uint8) rides in the last
delta's `RequestDelta.image`. A failed request raises `OpenAIError` (503 when a shutdown
aborted it, 500 when a stage failed); leaving early aborts it in every stage.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from omnistage.entrypoints.openai.deltas import RequestDelta, SequenceDelta
from omnistage.pipeline.outputs import OmniRequestOutput


class PipelineStream:
    """The deltas of one pipeline request whose first update is `first`."""

    def __init__(
        self,
        request_id: str,
        updates: AsyncIterator[OmniRequestOutput],
        first: OmniRequestOutput,
        num_prompt_tokens: int,
        text_stage: str | None,
        audio_stage: str | None,
        abort: Callable[[str], None],
        observer: Any = None,
        arrival: float | None = None,
        image_stage: str | None = None,
    ) -> None:
        self.request_id = request_id
        self.finished = False
        self._num_prompt_tokens = num_prompt_tokens
        self._updates = updates
        self._next: OmniRequestOutput | None = first
        self._text_stage, self._audio_stage = text_stage, audio_stage
        self._image_stage = image_stage
        self._abort, self._observer = abort, observer
        self._arrival = time.monotonic() if arrival is None else arrival
        self._pending_tokens: list[int] = []
        self._sent_text = ""
        self._seen_audio = False
        self._last: OmniRequestOutput = first

    @property
    def num_prompt_tokens(self) -> int:
        """The text stage's prompt as its model took it (media placeholders expanded) once it
        reported it; until then, the count of the rendered prompt."""
        return self._num_prompt_tokens

    def __aiter__(self) -> PipelineStream:
        return self

    async def __anext__(self) -> RequestDelta:
        while not self.finished:
            output = self._next
            self._next = None
            if output is None:
                try:
                    output = await anext(self._updates)
                except BaseException:
                    self.finished = True
                    raise
            self._last = output
            self.finished = output.finished
            result = output.outputs.get(self._text_stage) if self._text_stage else None
            if result is not None and result.num_prompt_tokens is not None:
                self._num_prompt_tokens = result.num_prompt_tokens
            delta = self._delta(output)
            if delta is not None:
                return delta
        raise StopAsyncIteration

    def _delta(self, output: OmniRequestOutput) -> RequestDelta | None:
        sequences: list[SequenceDelta] = []
        if output.stage == self._text_stage:
            self._pending_tokens += output.new_token_ids
            self._sent_text += output.new_text
        text = output.new_text if output.stage == self._text_stage else ""
        if output.finished:
            result = output.outputs.get(self._text_stage) if self._text_stage else None
            if result is not None and result.text.startswith(self._sent_text):
                text += result.text[len(self._sent_text) :]  # what no update carried
            reason = (result.finish_reason if result is not None else None) or "stop"
            sequences.append(SequenceDelta(0, text, self._pending_tokens, None, reason))
        elif text:
            sequences.append(SequenceDelta(0, text, self._pending_tokens, None))
        if sequences:
            self._pending_tokens = []
        audio = None
        if self._audio_stage is not None and output.stage == self._audio_stage:
            audio = output.new_data
        if audio is not None or (
            output.finished and self._audio_stage is not None and output.audio is not None
        ):
            self._first_audio()
        if not sequences and audio is None:
            return None
        image = None
        if output.finished and self._image_stage is not None:
            result = output.outputs.get(self._image_stage)
            image = None if result is None or result.data is None else result.data.numpy()
        return RequestDelta(
            self.request_id,
            sequences,
            output.finished,
            self._num_prompt_tokens,
            audio=audio,
            image=image,
        )

    def _first_audio(self) -> None:
        if not self._seen_audio and self._observer is not None:
            self._observer.on_first_audio(self._audio_stage, time.monotonic() - self._arrival)
        self._seen_audio = True

    def final_audio(self) -> tuple[Any, int] | None:
        """The whole answer's audio (samples, rate), once finished with audio; else None."""
        output = self._last
        if not self.finished or output.audio is None or output.sample_rate is None:
            return None
        return output.audio, output.sample_rate

    def abort(self) -> None:
        if not self.finished:
            self.finished = True
            self._abort(self.request_id)

    async def __aenter__(self) -> PipelineStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.abort()
        with contextlib.suppress(Exception):
            await self._updates.aclose()  # type: ignore[attr-defined]
