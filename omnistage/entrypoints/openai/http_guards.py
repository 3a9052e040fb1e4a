"""The server's guards in front of every route: the API key and the request body's size.

- `ApiKeyMiddleware`: with `--api-key`, every route but `OPEN_PATHS` (the health check
  and the Prometheus scrape; with `--ui` also the playground's page, which holds no
  secret) needs `Authorization: Bearer <key>` — the OpenAI routes and
  also FastAPI's `/docs`, `/redoc` and `/openapi.json`, which describe the whole API.
  A 401 in OpenAI's error shape otherwise; a WebSocket upgrade (/v1/realtime) without
  it is refused (403).
- `BodyLimitMiddleware`: a request body over `max_bytes` (`--max-request-bytes`) is a 413
  naming the limit: at once when its `Content-Length` says so, or, for a chunked body,
  as soon as the bytes received pass it (the route then sees its client gone, and what
  it answers is dropped for the 413).
"""

from __future__ import annotations

import secrets
from http import HTTPStatus

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from omnistage.entrypoints.openai.errors import OpenAIError, error_response

OPEN_PATHS = frozenset({"/health", "/metrics"})
"""Routes answered without the API key."""

DEFAULT_MAX_REQUEST_BYTES = 64 * 1024 * 1024
"""64 MiB: a chat request with a few images or a long clip of audio in base64 fits."""


class ApiKeyMiddleware:
    """401 in OpenAI's shape for requests without `Authorization: Bearer <key>` (but
    `open_paths`, compared without a trailing slash, and paths under `open_prefixes`: the
    playground's page, where it is served)."""

    def __init__(
        self,
        app: ASGIApp,
        api_key: str,
        open_paths: frozenset[str] = OPEN_PATHS,
        open_prefixes: tuple[str, ...] = (),
    ) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.open_paths = open_paths
        self.open_prefixes = open_prefixes

    def is_open(self, path: str) -> bool:
        return path.rstrip("/") in self.open_paths or path.startswith(self.open_prefixes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        guarded = scope["type"] in ("http", "websocket")
        if guarded and not self.is_open(scope["path"]):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not secrets.compare_digest(given, self.expected):
                if scope["type"] == "websocket":  # refused before the upgrade: a 403
                    await send({"type": "websocket.close", "code": 1008})
                    return
                response = error_response(
                    "invalid or missing API key: send the header Authorization: Bearer <key>",
                    HTTPStatus.UNAUTHORIZED,
                    code="invalid_api_key",
                )
                response.headers["WWW-Authenticate"] = "Bearer"
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """413 for a request body over `max_bytes` (see the module)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large(int(declared)).response()(scope, receive, send)
            return
        received, refused = 0, None

        async def counted() -> Message:
            nonlocal received, refused
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:  # the route sees a client gone, answers nobody
                    refused = self._too_large(received, at_least=True)
                    return {"type": "http.disconnect"}
            return message

        async def unless_refused(message: Message) -> None:
            if refused is None:
                await send(message)

        try:
            await self.app(scope, counted, unless_refused)
        except Exception:
            if refused is None:
                raise
        if refused is not None:
            await refused.response()(scope, receive, send)

    def _too_large(self, size: int, at_least: bool = False) -> OpenAIError:
        size_text = f"{size} bytes{' and more' if at_least else ''}"
        return OpenAIError(
            f"request body: {size_text} is over the limit of {self.max_bytes} bytes "
            "(the server's --max-request-bytes)",
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            code="request_too_large",
        )
