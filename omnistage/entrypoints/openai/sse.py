"""Server-sent events, and ending work when the client goes away.

`EventStream` sends `data: <json>` events and always watches for the client's
disconnect (whatever ASGI spec version the server speaks): on a disconnect the
body iterator is cancelled, so the `async with stream` around a request's
`RequestStream` aborts it in the engine. `until_disconnect` does the same for
non-streamed responses, whose handler would otherwise run to the end unheard.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

import anyio
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from omnistage.entrypoints.openai.errors import ClientDisconnected

T = TypeVar("T")

DONE = "data: [DONE]\n\n"


def sse(event: BaseModel | str) -> str:
    """One `data:` event (a model as JSON without null fields, or a ready string)."""
    body = event if isinstance(event, str) else event.model_dump_json(exclude_none=True)
    return f"data: {body}\n\n"


class EventStream(StreamingResponse):
    """`text/event-stream` whose body iterator is cancelled when the client disconnects."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[str]) -> None:
        super().__init__(events, headers={"Cache-Control": "no-cache"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        with contextlib.suppress(OSError):  # the socket is gone: nothing left to tell
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    await self.stream_response(send)
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it (and raising ClientDisconnected) if the client leaves."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
        watcher.cancel()
    if task.cancelled() or not task.done():
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise ClientDisconnected
    return task.result()


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
