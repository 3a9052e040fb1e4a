"""The state of one realtime connection: its settings, conversation, input audio buffer
and the response that runs, and what each client event does to them.

    session.update               -> session.updated        (settings; voice checked)
    conversation.item.create     -> conversation.item.created
    conversation.item.delete     -> conversation.item.deleted
    input_audio_buffer.append    (no answer)
    input_audio_buffer.commit    -> input_audio_buffer.committed, conversation.item.created
    input_audio_buffer.clear     -> input_audio_buffer.cleared
    response.create              -> response.created ... response.done (realtime_response)
    response.cancel              -> the running response's response.done (cancelled)

At most one response runs. A new `response.create` or a committed input while one
runs interrupts it first: its task is cancelled, which aborts its request in every
stage, and it ends with `response.done` status `cancelled` before anything of the
new one is sent. An event refused (`EventError`, `OpenAIError`) is an `error` event
naming the field; it changes nothing and the session goes on. `close` (the socket is
gone) interrupts the running response the same way.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from omnistage.entrypoints.openai.errors import OpenAIError
from omnistage.entrypoints.openai.realtime_audio import InputAudioBuffer
from omnistage.entrypoints.openai.realtime_conversation import (
    Conversation,
    audio_item,
    client_item,
)
from omnistage.entrypoints.openai.realtime_events import (
    AudioAppend,
    AudioClear,
    AudioCommit,
    ClientEvent,
    EventError,
    GenerationConfig,
    ItemCreate,
    ItemDelete,
    ItemObject,
    ResponseCancel,
    ResponseCreate,
    SessionConfig,
    SessionObject,
    SessionUpdate,
    error_event,
    new_id,
    parse_event,
    server_event,
)
from omnistage.entrypoints.openai.realtime_response import RealtimeResponse, ResponseSettings, Send
from omnistage.entrypoints.openai.serving import OpenAIServing


class RealtimeSession:
    """One connection's state (see the module); `handle` each client message in order."""

    def __init__(self, serving: OpenAIServing, model: str, send: Send) -> None:
        self.serving, self.model, self.send = serving, model, send
        self.client = serving.ctx.client
        self.id = new_id("sess")
        defaults = self.client.default_sampling
        max_tokens = defaults.get("max_tokens")
        self.settings = ResponseSettings(
            modalities=("text", "audio"),
            voice=None,
            instructions="",
            temperature=defaults.get("temperature"),
            max_tokens=max_tokens if isinstance(max_tokens, int) else None,
            seed=None,
        )
        self.conversation = Conversation()
        self.buffer = InputAudioBuffer()
        self.response: RealtimeResponse | None = None
        self._task: asyncio.Task[None] | None = None
        self._handlers: dict[type[ClientEvent], Any] = {
            SessionUpdate: self._session_update,
            ItemCreate: self._item_create,
            ItemDelete: self._item_delete,
            AudioAppend: self._append,
            AudioCommit: self._commit,
            AudioClear: self._clear,
            ResponseCreate: self._response_create,
            ResponseCancel: self._response_cancel,
        }

    def describe(self) -> SessionObject:
        s = self.settings
        default_voice = getattr(self.client, "default_voice", None)
        return SessionObject(
            id=self.id,
            model=self.model,
            modalities=list(s.modalities),
            instructions=s.instructions,
            voice=s.voice or default_voice,
            temperature=s.temperature,
            max_response_output_tokens="inf" if s.max_tokens is None else s.max_tokens,
            seed=s.seed,
        )

    async def start(self) -> None:
        await self.send(server_event("session.created", session=self.describe()))

    async def handle(self, text: str) -> None:
        """Do what the client event in `text` asks; an `error` event if it is refused."""
        event_id = None
        try:
            event = parse_event(text)
            event_id = event.event_id
            await self._handlers[type(event)](event)
        except EventError as exc:
            await self.send(error_event(exc, exc.event_id or event_id))
        except OpenAIError as exc:
            await self.send(error_event(exc, event_id))

    async def close(self) -> None:
        """The socket is gone: interrupt the running response (its request is aborted)."""
        await self._interrupt("client_cancelled")

    # -- settings ------------------------------------------------------------------------------
    def _merge(self, config: GenerationConfig, where: str) -> ResponseSettings:
        """The settings with what `config` gives over them; errors name `where.field`."""
        given = config.model_fields_set
        changes: dict[str, Any] = {}
        if "modalities" in given and config.modalities is not None:
            if "text" not in config.modalities:
                raise EventError(
                    f"{where}.modalities: must include 'text' (['text'] or ['text', 'audio'])",
                    f"{where}.modalities",
                )
            changes["modalities"] = ("text", "audio") if "audio" in config.modalities else ("text",)
        if "voice" in given:
            changes["voice"] = self.client.check_voice(config.voice, f"{where}.voice")
        if "instructions" in given:
            changes["instructions"] = config.instructions or ""
        if "temperature" in given:
            changes["temperature"] = config.temperature
        if "max_response_output_tokens" in given and config.max_response_output_tokens is not None:
            tokens = config.max_response_output_tokens
            changes["max_tokens"] = None if tokens == "inf" else tokens
        if "seed" in given:
            changes["seed"] = config.seed
        return dataclasses.replace(self.settings, **changes)

    async def _session_update(self, event: SessionUpdate) -> None:
        _check_served(event.session)
        self.settings = self._merge(event.session, "session")
        await self.send(server_event("session.updated", session=self.describe()))

    # -- conversation and input audio ----------------------------------------------------------
    async def _item_create(self, event: ItemCreate) -> None:
        item, audio = client_item(event.item)
        previous = self.conversation.add(item, event.previous_item_id, audio)
        await self.send(
            server_event("conversation.item.created", previous_item_id=previous, item=item)
        )

    async def _item_delete(self, event: ItemDelete) -> None:
        self.conversation.delete(event.item_id)
        await self.send(server_event("conversation.item.deleted", item_id=event.item_id))

    async def _append(self, event: AudioAppend) -> None:
        self.buffer.append(event.audio)

    async def _clear(self, event: AudioClear) -> None:
        self.buffer.clear()
        await self.send(server_event("input_audio_buffer.cleared"))

    async def _commit(self, event: AudioCommit) -> None:
        pcm = self.buffer.take()
        await self._interrupt("turn_detected")  # the user spoke over the response
        item, audio = audio_item(pcm)
        previous = self.conversation.add(item, None, audio)
        await self.send(
            server_event("input_audio_buffer.committed", previous_item_id=previous, item_id=item.id)
        )
        await self.send(
            server_event("conversation.item.created", previous_item_id=previous, item=item)
        )

    # -- responses -----------------------------------------------------------------------------
    async def _response_create(self, event: ResponseCreate) -> None:
        settings = self._merge(event.response or GenerationConfig(), "response")
        await self._interrupt("client_cancelled")
        messages = self.conversation.messages(settings.instructions)
        response = RealtimeResponse(
            self.serving, settings, messages, self.send, self._add_reply, event.event_id
        )
        self.response = response
        await response.created()
        self._task = asyncio.create_task(response.run())

    def _add_reply(self, item: ItemObject) -> str | None:
        return self.conversation.add(item)

    async def _response_cancel(self, event: ResponseCancel) -> None:
        running = self.response if self._task is not None and not self._task.done() else None
        if running is None or event.response_id not in (None, running.id):
            which = f" {event.response_id}" if event.response_id else ""
            raise EventError(
                f"response_id: no response{which} is in progress",
                "response_id",
                "response_cancel_not_active",
            )
        await self._interrupt("client_cancelled")

    async def _interrupt(self, reason: str) -> None:
        """Cancel the running response (its request aborted in every stage) and wait until
        it has sent its `response.done` (cancelled)."""
        task, response = self._task, self.response
        self._task = None
        if task is None or response is None or task.done():
            return
        if not response.finishing:  # else its request ended already: let it send its end
            response.cancel_reason = reason
            task.cancel()
        await asyncio.wait({task})
        await response.end_cancelled()  # if the task was cancelled before it began


def _check_served(config: SessionConfig) -> None:
    """EventError naming the field for session settings this server does not serve."""
    for name in ("turn_detection", "input_audio_transcription"):
        if getattr(config, name) is not None:
            why = "the client commits its audio" if name == "turn_detection" else "none is made"
            raise EventError(f"session.{name}: only null is served ({why})", f"session.{name}")
    if config.tools:
        raise EventError("session.tools: tool calling is not supported", "session.tools")
    if config.tool_choice not in (None, "none", "auto"):
        raise EventError(
            "session.tool_choice: tool calling is not supported (use none or auto)",
            "session.tool_choice",
        )
