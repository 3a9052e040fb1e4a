"""The events of WebSocket /v1/realtime, in the shapes of OpenAI's Realtime API.

Client events are pydantic models (`CLIENT_EVENTS`, by `type`), strict and closed
like every request body here (`protocol.RequestModel`): an unknown field, a wrong
type or an out-of-range value is an `error` event naming the field (`parse_event`),
never silently ignored. The objects the server describes (the session, a
conversation item, a response and its usage) are models too; each server event is a
JSON object `{"type": ..., "event_id": ..., ...}` built by `server_event`.

What is served is what the omni pipelines can do: text or audio (pcm16) in, text
and audio (pcm16) out, no server VAD (`turn_detection` null: the client commits its
audio), no tools, no input transcription. `seed` (session or response) is an
extension: it seeds every stage, so a seeded response is reproducible.
"""

from __future__ import annotations

import json
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError

from omnistage.entrypoints.openai.errors import (
    OpenAIError,
    describe_validation_errors,
    error_info,
)
from omnistage.entrypoints.openai.protocol import INT64_MAX, INT64_MIN, Int, RequestModel

MAX_TEXT_CHARS = 1 << 20
"""Bound on one text field of an event (instructions, an input_text part)."""
MAX_TOKENS = Annotated[Int, Field(ge=1, le=1 << 20)]
Modality = Literal["text", "audio"]


def new_id(prefix: str) -> str:
    """An id in OpenAI's style: `event_...`, `item_...`, `resp_...`, `sess_...`."""
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


# -- client events ---------------------------------------------------------------------------
class GenerationConfig(RequestModel):
    """What a response is made with: the session's (`session.update`), or one response's
    (`response.create`'s `response`, over the session's)."""

    modalities: Annotated[list[Modality], Field(min_length=1, max_length=2)] | None = None
    voice: Annotated[str, Field(max_length=256)] | None = None
    instructions: Annotated[str, Field(max_length=MAX_TEXT_CHARS)] | None = None
    output_audio_format: Literal["pcm16"] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    max_response_output_tokens: MAX_TOKENS | Literal["inf"] | None = None
    seed: Annotated[Int, Field(ge=INT64_MIN, le=INT64_MAX)] | None = None
    """Extension: seeds every stage (OpenAI has none)."""


class SessionConfig(GenerationConfig):
    input_audio_format: Literal["pcm16"] | None = None
    turn_detection: dict[str, Any] | None = None
    """Only null is served: no server VAD, the client commits its audio."""
    input_audio_transcription: dict[str, Any] | None = None
    """Only null is served."""
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | None = None


class ContentPart(RequestModel):
    type: Literal["input_text", "input_audio", "text", "audio"]
    text: Annotated[str, Field(max_length=MAX_TEXT_CHARS)] | None = None
    audio: str | None = None
    """Base64 pcm16 at `INPUT_RATE` (input_audio)."""
    transcript: Annotated[str, Field(max_length=MAX_TEXT_CHARS)] | None = None


class ConversationItem(RequestModel):
    id: Annotated[str, Field(max_length=64)] | None = None
    type: Literal["message"] = "message"
    object: Literal["realtime.item"] | None = None
    status: str | None = None
    role: Literal["user", "assistant", "system"]
    content: Annotated[list[ContentPart], Field(max_length=64)]


class ClientEvent(RequestModel):
    event_id: Annotated[str, Field(max_length=512)] | None = None


class SessionUpdate(ClientEvent):
    type: Literal["session.update"]
    session: SessionConfig


class ItemCreate(ClientEvent):
    type: Literal["conversation.item.create"]
    previous_item_id: Annotated[str, Field(max_length=64)] | None = None
    item: ConversationItem


class ItemDelete(ClientEvent):
    type: Literal["conversation.item.delete"]
    item_id: Annotated[str, Field(max_length=64)]


class AudioAppend(ClientEvent):
    type: Literal["input_audio_buffer.append"]
    audio: str


class AudioCommit(ClientEvent):
    type: Literal["input_audio_buffer.commit"]


class AudioClear(ClientEvent):
    type: Literal["input_audio_buffer.clear"]


class ResponseCreate(ClientEvent):
    type: Literal["response.create"]
    response: GenerationConfig | None = None


class ResponseCancel(ClientEvent):
    type: Literal["response.cancel"]
    response_id: Annotated[str, Field(max_length=64)] | None = None


CLIENT_EVENTS: dict[str, type[ClientEvent]] = {
    "session.update": SessionUpdate,
    "conversation.item.create": ItemCreate,
    "conversation.item.delete": ItemDelete,
    "input_audio_buffer.append": AudioAppend,
    "input_audio_buffer.commit": AudioCommit,
    "input_audio_buffer.clear": AudioClear,
    "response.create": ResponseCreate,
    "response.cancel": ResponseCancel,
}
NOT_SERVED = frozenset({"conversation.item.truncate", "conversation.item.retrieve"})
"""OpenAI client events this server knows but does not serve (an error naming `type`)."""


class EventError(OpenAIError):
    """A client event refused: sent back as an `error` event (the connection goes on)."""

    def __init__(
        self,
        message: str,
        param: str | None,
        code: str = "invalid_value",
        event_id: str | None = None,
    ) -> None:
        super().__init__(message, param=param, code=code)
        self.event_id = event_id


def parse_event(text: str) -> ClientEvent:
    """The client event in `text` (one WebSocket message); EventError naming the field."""
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise EventError(f"invalid JSON in the event: {exc}", None, "invalid_json") from None
    if not isinstance(raw, dict):
        raise EventError("an event must be a JSON object", None, "invalid_json")
    event_id = raw.get("event_id") if isinstance(raw.get("event_id"), str) else None
    kind = raw.get("type")
    model = CLIENT_EVENTS.get(kind) if isinstance(kind, str) else None
    if model is None:
        served = ", ".join(CLIENT_EVENTS)
        why = "is not served here" if kind in NOT_SERVED else "is not a client event type"
        raise EventError(
            f"type: {kind!r} {why}; served: {served}", "type", "invalid_value", event_id
        )
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        message, _ = describe_validation_errors(exc.errors())
        raise EventError(message, _param(exc), "invalid_value", event_id) from None


def _param(exc: ValidationError) -> str | None:
    """The dotted path of the first invalid field (`session.voice`, `item.content[0].type`)."""
    errors = exc.errors()
    if not errors:
        return None
    path = ""
    for part in errors[0].get("loc", ()):
        if isinstance(part, int):
            path += f"[{part}]"
        elif "[" in str(part) or str(part).startswith("function-"):
            continue  # a union member's tag
        else:
            path += f".{part}" if path else str(part)
    return path or None


# -- what the server describes ---------------------------------------------------------------
class SessionObject(BaseModel):
    id: str
    object: Literal["realtime.session"] = "realtime.session"
    model: str
    modalities: list[str]
    instructions: str
    voice: str | None
    input_audio_format: str = "pcm16"
    output_audio_format: str = "pcm16"
    input_audio_transcription: None = None
    turn_detection: None = None
    tools: list[Any] = Field(default_factory=list)
    tool_choice: str = "none"
    temperature: float | None
    max_response_output_tokens: int | Literal["inf"]
    seed: int | None = None


class ItemObject(BaseModel):
    id: str
    object: Literal["realtime.item"] = "realtime.item"
    type: Literal["message"] = "message"
    status: Literal["completed", "in_progress", "incomplete"] = "completed"
    role: str
    content: list[dict[str, Any]]


class UsageObject(BaseModel):
    total_tokens: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    input_token_details: dict[str, int] = Field(default_factory=dict)
    output_token_details: dict[str, int] = Field(default_factory=dict)


class ResponseObject(BaseModel):
    id: str
    object: Literal["realtime.response"] = "realtime.response"
    status: Literal["in_progress", "completed", "cancelled", "incomplete", "failed"]
    status_details: dict[str, Any] | None = None
    output: list[ItemObject] = Field(default_factory=list)
    usage: UsageObject | None = None
    modalities: list[str]
    voice: str | None
    output_audio_format: str = "pcm16"
    temperature: float | None
    max_output_tokens: int | Literal["inf"]


def server_event(kind: str, **fields: Any) -> dict[str, Any]:
    """A server event: `type`, a fresh `event_id`, and `fields` (models dumped)."""
    body = {k: v.model_dump() if isinstance(v, BaseModel) else v for k, v in fields.items()}
    return {"type": kind, "event_id": new_id("event"), **body}


def error_event(exc: OpenAIError, event_id: str | None = None) -> dict[str, Any]:
    """An `error` event in OpenAI's shape: type, code, message, param, and the `event_id`
    of the client event it answers (None when unknown)."""
    code = exc.code if exc.code is not None else exc.status
    info = error_info(exc.message, exc.status, exc.param, exc.type, code)
    return server_event("error", error={**info.model_dump(), "event_id": event_id})
