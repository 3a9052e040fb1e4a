"""`RequestStream`: one text request's `RequestDelta`s, handed from the engine thread to
the event loop (a `client.DeltaStream`).

The engine thread `_put`s deltas (or the exception that ended the request) with
`loop.call_soon_threadsafe`; the handler iterates them, and leaving early (`abort`,
or the end of `async with`) asks the client to abort the request in the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

from omnistage.entrypoints.openai.deltas import RequestDelta


class Aborter(Protocol):
    def abort(self, request_id: str) -> None: ...


class RequestStream:
    """The deltas of one request, in order; ends after the one marked `finished`."""

    def __init__(self, request_id: str, client: Aborter) -> None:
        self.request_id = request_id
        self.prompt_token_ids: list[int] = []
        self._client = client
        self._queue: asyncio.Queue[RequestDelta | BaseException] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self.finished = False

    def _put(self, item: RequestDelta | BaseException) -> None:
        """Called from the engine thread."""
        with contextlib.suppress(RuntimeError):  # the event loop is closed
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestDelta:
        if self.finished:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        self.finished = item.finished
        return item

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    def final_audio(self) -> None:
        """A text model speaks no audio."""
        return None

    def abort(self) -> None:
        """Abort the request unless it already ended (idempotent, never blocks)."""
        if not self.finished:
            self.finished = True
            self._client.abort(self.request_id)

    async def __aenter__(self) -> RequestStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.abort()
