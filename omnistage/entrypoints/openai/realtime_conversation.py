"""The conversation of one realtime session: its items in order, and the chat messages
a response's prompt is built from.

Items are OpenAI's conversation items (`realtime_events.ItemObject`): user messages of
`input_text` / `input_audio` parts, system messages, and the assistant's replies (text
or audio with its transcript). A response's prompt is every item as the chat route
would render it (`messages`): text parts as text (a message of text only as one
string, as a chat client sends it), a user's audio as the chat's `input_audio` part
(a WAV, `realtime_audio.wav_base64`), an assistant's audio as its transcript.
"""

from __future__ import annotations

from typing import Any

from omnistage.entrypoints.openai.realtime_audio import check_length, decode_pcm16, wav_base64
from omnistage.entrypoints.openai.realtime_events import (
    ConversationItem,
    EventError,
    ItemObject,
    new_id,
)

MAX_ITEMS = 1024
"""Bound on a conversation's items (each response reads all of them)."""
_ROLE_PARTS = {
    "user": {"input_text", "input_audio"},
    "system": {"input_text"},
    "assistant": {"text", "audio"},
}


class Conversation:
    """The items of one session, and the audio of its user audio parts (by item id)."""

    def __init__(self) -> None:
        self.items: list[ItemObject] = []
        self._audio: dict[tuple[str, int], str] = {}
        """(item id, part index) -> the part's audio as a base64 WAV."""

    @property
    def last_id(self) -> str | None:
        return self.items[-1].id if self.items else None

    def add(
        self, item: ItemObject, after: str | None = None, audio: dict[int, str] | None = None
    ) -> str | None:
        """Insert `item` after the item `after` (None: at the end; "root": first); its
        user audio parts' WAVs are `audio` (part index -> base64 WAV). Returns the id of the
        item before it (None: it is first)."""
        if len(self.items) >= MAX_ITEMS:
            raise EventError(
                f"item: the conversation holds {MAX_ITEMS} items, its limit; delete some",
                "item",
            )
        if any(i.id == item.id for i in self.items):
            raise EventError(f"item.id: an item {item.id!r} exists already", "item.id")
        index = len(self.items)
        if after == "root":
            index = 0
        elif after is not None:
            index = self._index(after, "previous_item_id") + 1
        self.items.insert(index, item)
        for part, wav in (audio or {}).items():
            self._audio[(item.id, part)] = wav
        return self.items[index - 1].id if index > 0 else None

    def delete(self, item_id: str) -> None:
        del self.items[self._index(item_id, "item_id")]
        self._audio = {k: v for k, v in self._audio.items() if k[0] != item_id}

    def _index(self, item_id: str, param: str) -> int:
        for i, item in enumerate(self.items):
            if item.id == item_id:
                return i
        raise EventError(f"{param}: no item {item_id!r} in the conversation", param)

    def messages(self, instructions: str | None) -> list[dict[str, Any]]:
        """The conversation as the chat messages `render_chat` takes, after a system
        message with `instructions` (none when empty)."""
        out: list[dict[str, Any]] = []
        if instructions:
            out.append({"role": "system", "content": instructions})
        for item in self.items:
            parts = [self._part(item, i, p) for i, p in enumerate(item.content)]
            parts = [p for p in parts if p is not None]
            if all(p["type"] == "text" for p in parts):
                out.append({"role": item.role, "content": "".join(p["text"] for p in parts)})
            else:
                out.append({"role": item.role, "content": parts})
        return out

    def _part(self, item: ItemObject, index: int, part: dict[str, Any]) -> dict[str, Any] | None:
        kind = part.get("type")
        if kind == "input_audio":
            wav = self._audio.get((item.id, index))
            if wav is None:  # a transcript only (no audio kept)
                return {"type": "text", "text": part.get("transcript") or ""}
            return {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}
        text = part.get("text") if kind in ("input_text", "text") else part.get("transcript")
        return {"type": "text", "text": text or ""}


def client_item(item: ConversationItem) -> tuple[ItemObject, dict[int, str]]:
    """A `conversation.item.create`'s item as the conversation keeps it, with the WAVs of
    its audio parts (by part index); EventError naming the part for what a role cannot
    say or audio that is not pcm16."""
    allowed = _ROLE_PARTS[item.role]
    content: list[dict[str, Any]] = []
    audio: dict[int, str] = {}
    for i, part in enumerate(item.content):
        where = f"item.content[{i}]"
        if part.type not in allowed:
            raise EventError(
                f"{where}.type: a {item.role} message takes {', '.join(sorted(allowed))} "
                f"parts, not {part.type}",
                f"{where}.type",
            )
        if part.type == "input_audio":
            if part.audio is None:
                raise EventError(f"{where}.audio: input_audio needs audio", f"{where}.audio")
            pcm = decode_pcm16(part.audio, f"{where}.audio")
            check_length(len(pcm), f"{where}.audio")
            audio[i] = wav_base64(pcm)
            content.append({"type": "input_audio", "transcript": part.transcript})
        elif part.type == "audio":
            content.append({"type": "audio", "transcript": part.transcript or ""})
        elif part.text is None:
            raise EventError(f"{where}.text: a {part.type} part needs text", f"{where}.text")
        else:
            content.append({"type": part.type, "text": part.text})
    item_id = item.id or new_id("item")
    return ItemObject(id=item_id, role=item.role, content=content), audio


def audio_item(pcm: bytes, item_id: str | None = None) -> tuple[ItemObject, dict[int, str]]:
    """A user message of one committed clip of pcm16, with its WAV."""
    content = [{"type": "input_audio", "transcript": None}]
    item = ItemObject(id=item_id or new_id("item"), role="user", content=content)
    return item, {0: wav_base64(pcm)}
