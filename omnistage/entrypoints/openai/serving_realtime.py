"""WebSocket /v1/realtime: OpenAI's Realtime API over a pipeline that writes text and
speaks (demo-omni, Qwen3-Omni, Qwen2.5-Omni).

    ws://HOST/v1/realtime?model=demo-omni
    <- session.created
    -> {"type": "conversation.item.create", "item": {"type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "Hi!"}]}}
    -> {"type": "response.create"}
    <- response.created ... response.audio.delta ... response.done

One connection is one `RealtimeSession` (its settings, conversation, audio buffer and
running response); this module only accepts the socket, checks the model, hands each
text message to the session and, when the socket closes, closes the session, which
aborts a running response in every stage. A model that is not served is an `error`
event (`model_not_found`) and the socket is closed (1008). With `--api-key`, the
upgrade request needs `Authorization: Bearer KEY` (`http_guards.ApiKeyMiddleware`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect

from omnistage.entrypoints.openai.errors import OpenAIError
from omnistage.entrypoints.openai.realtime_events import error_event
from omnistage.entrypoints.openai.realtime_session import RealtimeSession
from omnistage.entrypoints.openai.serving import OpenAIServing, ServingContext

logger = logging.getLogger(__name__)

POLICY_VIOLATION = 1008


class _Sender:
    """Sends server events as JSON text, one at a time; once the socket is gone, drops
    them (a response being cancelled still ends in order, unheard)."""

    def __init__(self, websocket: WebSocket) -> None:
        self.websocket = websocket
        self.closed = False
        self._lock = asyncio.Lock()

    async def __call__(self, event: dict[str, Any]) -> None:
        async with self._lock:
            if self.closed:
                return
            try:
                await self.websocket.send_text(json.dumps(event))
            except (WebSocketDisconnect, RuntimeError, OSError):
                self.closed = True


class RealtimeServing(OpenAIServing):
    @classmethod
    def enabled(cls, ctx: ServingContext) -> bool:
        return ctx.client.speaks and "text" in ctx.client.produces

    def register(self, router: APIRouter) -> None:
        router.add_api_websocket_route("/v1/realtime", self.connect)

    async def connect(self, websocket: WebSocket) -> None:
        await websocket.accept()
        send = _Sender(websocket)
        model = websocket.query_params.get("model")
        try:
            if not model:
                raise OpenAIError(
                    "model: give the model in the URL: /v1/realtime?model=NAME", param="model"
                )
            self.check_model(model)
        except OpenAIError as exc:
            await send(error_event(exc))
            await websocket.close(POLICY_VIOLATION)
            return
        session = RealtimeSession(self, model, send)
        try:
            await session.start()
            await self._serve(websocket, session, send)
        finally:
            await session.close()

    async def _serve(self, websocket: WebSocket, session: RealtimeSession, send: _Sender) -> None:
        """Hand each text message to the session until the socket closes."""
        while not send.closed:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            if text is None:
                error = OpenAIError(
                    "events are JSON text messages, not binary ones", code="invalid_event"
                )
                await send(error_event(error))
                continue
            await session.handle(text)
