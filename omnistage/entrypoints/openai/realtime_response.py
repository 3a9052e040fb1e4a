"""One realtime response: from the conversation's prompt to `response.done`.

    response.created
    response.output_item.added, conversation.item.created, response.content_part.added
    response.audio_transcript.delta / response.text.delta   (the thinker's text)
    response.audio.delta                                    (base64 pcm16, as the vocoder's
                                                             chunks arrive)
    response.audio.done, response.audio_transcript.done / response.text.done,
    response.content_part.done, response.output_item.done
    response.done   {status: completed | incomplete | cancelled | failed, usage}

A response is one pipeline request, added as the chat route adds one
(`render_chat` over the conversation's messages, `add_request` with the session's
modalities and voice) and read as its `DeltaStream`. Every `response.created` ends
with one `response.done`. Cancelling the task running `run` (a new response or a
committed input, `response.cancel`, the socket closing) leaves the stream's
`async with`, which aborts the request in every stage, as a chat client's disconnect
does; the response then ends `cancelled`. Input the model refuses (a prompt over the
context, audio it cannot decode) is an `error` event naming the field, and the
response ends `failed`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Literal

from omnistage.entrypoints.openai.client import DeltaStream, EngineDeadError
from omnistage.entrypoints.openai.errors import OpenAIError, error_info
from omnistage.entrypoints.openai.realtime_events import (
    ItemObject,
    ResponseObject,
    UsageObject,
    error_event,
    new_id,
    server_event,
)
from omnistage.entrypoints.openai.serving import OpenAIServing, check_not_aborted
from omnistage.entrypoints.openai.serving_chat import MEDIA_RENAMES
from omnistage.entrypoints.openai.serving_speech import pcm16_base64
from omnistage.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

Send = Callable[[dict[str, Any]], Awaitable[None]]
Status = Literal["completed", "cancelled", "incomplete", "failed"]
RENAMES = {"prompt": "conversation", **{k: "conversation" for k in MEDIA_RENAMES}}
"""The engine's names for what a response's prompt is made of, as the session names it."""


@dataclass(frozen=True)
class ResponseSettings:
    """What one response is made with: the session's settings, the response's over them."""

    modalities: tuple[str, ...]
    voice: str | None
    """The talker's speaker, as the checkpoint spells it (None: the model's default)."""
    instructions: str
    temperature: float | None
    """None: the entry stage's default."""
    max_tokens: int | None
    """None: "inf" (until the context ends)."""
    seed: int | None


class RealtimeResponse:
    """One response of a session; `run` it as a task, cancel the task to interrupt it."""

    def __init__(
        self,
        serving: OpenAIServing,
        settings: ResponseSettings,
        messages: list[dict[str, Any]],
        send: Send,
        add_item: Callable[[ItemObject], str | None],
        event_id: str | None = None,
    ) -> None:
        self.serving, self.settings, self.messages = serving, settings, messages
        self.send, self.add_item = send, add_item
        self.id = new_id("resp")
        self.event_id = event_id
        """The `response.create` it answers (its errors name it)."""
        self.cancel_reason = "client_cancelled"
        """Why a cancelled response was (client_cancelled, turn_detected)."""
        self.item: ItemObject | None = None
        self.text = ""
        self.audio = "audio" in settings.modalities
        self.usage = UsageObject()
        self.ended = False
        """Whether `response.done` was sent."""
        self.finishing = False
        """Whether its request ended and it is sending its `.done` events."""

    def describe(self, status: str, details: dict[str, Any] | None = None) -> ResponseObject:
        s = self.settings
        return ResponseObject(
            id=self.id,
            status=status,  # type: ignore[arg-type]
            status_details=details,
            output=[self.item] if self.item is not None else [],
            usage=self.usage if status != "in_progress" else None,
            modalities=list(s.modalities),
            voice=s.voice or getattr(self.serving.ctx.client, "default_voice", None),
            temperature=s.temperature,
            max_output_tokens="inf" if s.max_tokens is None else s.max_tokens,
        )

    async def created(self) -> None:
        """Send `response.created` (before the task that `run`s it starts)."""
        await self.send(server_event("response.created", response=self.describe("in_progress")))

    async def end_cancelled(self) -> None:
        """`response.done` (cancelled) unless the response already ended: for a task
        cancelled before it began."""
        if not self.ended:
            await self._finish("cancelled", {"type": "cancelled", "reason": self.cancel_reason})

    async def run(self) -> None:
        """The response after `created`, to its `response.done` (see the module)."""
        details: dict[str, Any] | None = None
        try:
            stream = await self._add_request()
            status = await self._stream(stream)
            if status == "incomplete":
                details = {"type": "incomplete", "reason": "max_output_tokens"}
        except asyncio.CancelledError:
            await self._finish("cancelled", {"type": "cancelled", "reason": self.cancel_reason})
            raise
        except Exception as exc:  # the request failed (or a bug here): the session goes on
            error = _as_openai_error(exc)
            await self.send(error_event(error, self.event_id))
            status, details = "failed", {"type": "failed", "error": _error_details(error)}
        # Its request has ended: an interruption now waits for this rather than cancel it.
        self.finishing = True
        await self._finish(status, details)

    def sampling_params(self) -> SamplingParams:
        """The entry stage's params: its deploy defaults, the session's over them."""
        s = self.settings
        fields: dict[str, Any] = {"max_tokens": s.max_tokens}
        if s.temperature is not None:
            fields["temperature"] = s.temperature
        if s.seed is not None:
            fields["seed"] = s.seed
        try:
            return SamplingParams(**{**self.serving.ctx.client.default_sampling, **fields})
        except (ValueError, TypeError) as exc:
            raise OpenAIError.from_value_error(ValueError(str(exc))) from None

    async def _add_request(self) -> DeltaStream:
        client = self.serving.ctx.client
        try:
            chat = await asyncio.to_thread(client.render_chat, self.messages)
        except ValueError as exc:
            raise OpenAIError.from_value_error(exc, RENAMES) from None
        modalities = ["text", "audio"] if self.audio else ["text"]
        return await self.serving.add_request(
            chat,
            self.sampling_params(),
            self.id,
            {**RENAMES, "max_tokens": "max_response_output_tokens"},
            modalities=modalities,
            voice=self.settings.voice,
            clamp_max_tokens=self.settings.max_tokens is None,
        )

    async def _stream(self, stream: DeltaStream) -> Status:
        """Announce the reply's item, then send its text and audio as they come."""
        status: Status = "completed"
        async with stream:
            await self._announce(stream.num_prompt_tokens)
            async for delta in stream:
                check_not_aborted(delta)
                for seq in delta.sequences:
                    self.usage.output_tokens += len(seq.token_ids)
                    if seq.text:
                        self.text += seq.text
                        kind = "audio_transcript" if self.audio else "text"
                        await self._part_event(f"response.{kind}.delta", delta=seq.text)
                    if seq.finish_reason == "length":
                        status = "incomplete"
                if delta.audio is not None and self.audio:
                    await self._part_event("response.audio.delta", delta=pcm16_base64(delta.audio))
        self.usage.input_tokens = stream.num_prompt_tokens  # as the model took it, once known
        return status

    async def _announce(self, num_prompt_tokens: int) -> None:
        self.usage.input_tokens = num_prompt_tokens
        self.item = ItemObject(
            id=new_id("item"), status="in_progress", role="assistant", content=[]
        )
        previous = self.add_item(self.item)
        where = {"response_id": self.id, "output_index": 0}
        await self.send(server_event("response.output_item.added", **where, item=self.item))
        await self.send(
            server_event("conversation.item.created", previous_item_id=previous, item=self.item)
        )
        await self._part_event("response.content_part.added", part=self._part())

    def _part(self) -> dict[str, Any]:
        if self.audio:
            return {"type": "audio", "transcript": self.text}
        return {"type": "text", "text": self.text}

    async def _part_event(self, kind: str, **fields: Any) -> None:
        assert self.item is not None  # only after `_announce`
        where = {"response_id": self.id, "item_id": self.item.id, "output_index": 0}
        await self.send(server_event(kind, **where, content_index=0, **fields))

    async def _finish(self, status: Status, details: dict[str, Any] | None) -> None:
        """The `.done` events of what was announced, then `response.done`."""
        self.ended = True
        usage = self.usage
        usage.total_tokens = usage.input_tokens + usage.output_tokens
        usage.input_token_details = {"cached_tokens": 0, "text_tokens": usage.input_tokens}
        usage.output_token_details = {"text_tokens": usage.output_tokens, "audio_tokens": 0}
        if self.item is not None:
            self.item.content = [self._part()]
            self.item.status = "completed" if status == "completed" else "incomplete"
            if self.audio:
                await self._part_event("response.audio.done")
                await self._part_event("response.audio_transcript.done", transcript=self.text)
            else:
                await self._part_event("response.text.done", text=self.text)
            await self._part_event("response.content_part.done", part=self._part())
            await self.send(
                server_event(
                    "response.output_item.done", response_id=self.id, output_index=0, item=self.item
                )
            )
        await self.send(server_event("response.done", response=self.describe(status, details)))


def _as_openai_error(exc: Exception) -> OpenAIError:
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, EngineDeadError):
        return OpenAIError(str(exc), HTTPStatus.SERVICE_UNAVAILABLE)
    logger.exception("a realtime response failed", exc_info=exc)
    return OpenAIError(f"internal server error: {type(exc).__name__}", 500)


def _error_details(error: OpenAIError) -> dict[str, Any]:
    info = error_info(error.message, error.status, None, error.type, error.code or error.status)
    return {"type": info.type, "code": info.code, "message": info.message}
