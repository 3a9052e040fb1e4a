"""The OpenAI-compatible HTTP server: `build_app` (FastAPI) and `serve` (uvicorn).

    omnistage serve --model smollm2 --port 8000 [--api-key KEY] [--served-model-name NAME]
    omnistage serve --model demo-image|demo-omni|PIPELINE_CHECKPOINT  (or --deploy FILE|NAME)

Routes: the endpoints of each serving class (`DEFAULT_SERVINGS`: /v1/models,
/v1/chat/completions, /v1/completions, and where the model draws or speaks
/v1/images/generations and /v1/audio/speech, and WebSocket /v1/realtime where it both
writes text and speaks), plus GET /health and GET /metrics; with `ui` (`--ui`) the
playground page at /ui/ and a redirect there from GET / (`serving_playground.py`).
With an API key, every route but /health and /metrics (open, as in vLLM) wants
`Authorization: Bearer <key>` (401 otherwise), /docs and /openapi.json included; a
request body over `--max-request-bytes` is a 413 (`http_guards.py`). Slow clients are
bounded (`slow_clients.py`): a request header not complete within `--header-timeout-s`
closes the connection, a body not received within `--read-timeout-s` is a 408, and
beyond `--max-connections` open connections a new request is a 503.

One serving path: a text model (`AsyncEngineClient`) and a model whose deploy has
more than one stage, or `--deploy` (`PipelineClient`, an `AsyncOmni`) are both an
`EngineClient`, answered by the same handlers with the same errors. On a pipeline
that produces no text, chat and completions answer a 400 saying so; an endpoint
whose modality the model cannot produce is not registered (404). /metrics asks
every stage of a pipeline for its queue depth and KV cache use at each scrape.

Lifecycle: the app's lifespan starts the engine thread and, at the end, aborts
what is left and stops it. On SIGINT / SIGTERM `serve` first aborts every
in-flight request (their streams end at once with an error event, whole
responses with a 503), so uvicorn's graceful shutdown never waits on a long
generation; then the connections close and the engine stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import AsyncIterator, Sequence
from http import HTTPStatus
from typing import Any

import uvicorn
from fastapi import APIRouter, FastAPI
from fastapi.responses import JSONResponse, Response

from omnistage.config import DEFAULT_MODEL, EngineConfig
from omnistage.engine.worker_launch import LaunchedWorker
from omnistage.entrypoints.openai import serving_playground as playground
from omnistage.entrypoints.openai.client import EngineClient
from omnistage.entrypoints.openai.engine_client import AsyncEngineClient
from omnistage.entrypoints.openai.errors import error_response, install_error_handlers
from omnistage.entrypoints.openai.http_guards import (
    DEFAULT_MAX_REQUEST_BYTES,
    OPEN_PATHS,
    ApiKeyMiddleware,
    BodyLimitMiddleware,
)
from omnistage.entrypoints.openai.metrics import HttpMetricsMiddleware, ServerMetrics
from omnistage.entrypoints.openai.pipeline_client import PipelineClient
from omnistage.entrypoints.openai.pipeline_deploy import pipeline_deploy
from omnistage.entrypoints.openai.serving import OpenAIServing, ServingContext
from omnistage.entrypoints.openai.serving_chat import ChatServing
from omnistage.entrypoints.openai.serving_completion import CompletionServing
from omnistage.entrypoints.openai.serving_image_edits import ImageEditsServing
from omnistage.entrypoints.openai.serving_images import ImagesServing
from omnistage.entrypoints.openai.serving_models import ModelsServing
from omnistage.entrypoints.openai.serving_realtime import RealtimeServing
from omnistage.entrypoints.openai.serving_speech import SpeechServing
from omnistage.entrypoints.openai.serving_voices import VoicesServing
from omnistage.entrypoints.openai.slow_clients import (
    BodyTimeoutMiddleware,
    SlowClientLimits,
    server_config,
)

logger = logging.getLogger(__name__)

DEFAULT_SERVINGS: tuple[type[OpenAIServing], ...] = (
    ModelsServing,
    ChatServing,
    CompletionServing,
    ImagesServing,
    ImageEditsServing,
    SpeechServing,
    VoicesServing,
    RealtimeServing,
)
"""Endpoint families every app gets (each only where its `enabled` says so)."""


def build_app(
    client: EngineClient,
    served_model_names: Sequence[str],
    *,
    model_path: str | None = None,
    api_key: str | None = None,
    servings: Sequence[type[OpenAIServing]] | None = None,
    metrics: ServerMetrics | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    slow_clients: SlowClientLimits | None = None,
    ui: bool = False,
) -> FastAPI:
    """The app serving `client`'s model (a text model's engine, or a pipeline) under
    `served_model_names`. The app owns the client: its lifespan starts the engine thread
    and shuts it down (a pipeline's stage processes included). `servings` default:
    `DEFAULT_SERVINGS`; `slow_clients` (default `SlowClientLimits()`): the body's read
    timeout (the header's is the server's, see `server_config`). `ui`: serve the
    playground page at /ui/ (`serving_playground`)."""
    if not served_model_names:
        raise ValueError("served_model_names: give at least one name")
    if max_request_bytes < 1:
        raise ValueError(f"max_request_bytes: must be at least 1, got {max_request_bytes}")
    servings = DEFAULT_SERVINGS if servings is None else servings
    metrics = metrics or ServerMetrics()
    client.observe(metrics)
    ctx = ServingContext(client, list(served_model_names), model_path, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        client.start()
        try:
            yield
        finally:
            await asyncio.to_thread(client.shutdown)

    app = FastAPI(title="omnistage", summary="OpenAI-compatible server", lifespan=lifespan)
    install_error_handlers(app)
    router = APIRouter()
    _add_core_routes(router, ctx)
    for serving_class in servings:
        if serving_class.enabled(ctx):
            serving_class(ctx).register(router)
    app.include_router(router)
    if ui:
        playground.mount_playground(app)
    # Outermost last: metrics (count every answer), the API key (before any body is read),
    # the body limit, the body's read timeout.
    app.add_middleware(BodyTimeoutMiddleware, limits=slow_clients or SlowClientLimits())
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_request_bytes)
    if api_key:
        open_paths, open_prefixes = OPEN_PATHS, ()
        if ui:  # the page holds no secret; what it calls wants the key
            open_paths, open_prefixes = OPEN_PATHS | playground.OPEN_PATHS, playground.OPEN_PREFIXES
        app.add_middleware(
            ApiKeyMiddleware, api_key=api_key, open_paths=open_paths, open_prefixes=open_prefixes
        )
    app.add_middleware(HttpMetricsMiddleware, metrics=metrics)
    app.state.serving = ctx
    return app


def _add_core_routes(router: APIRouter, ctx: ServingContext) -> None:
    async def health() -> Response:
        if not ctx.client.is_alive:
            return error_response("the engine is not running", HTTPStatus.SERVICE_UNAVAILABLE)
        # A pipeline reports its stages (`PipelineClient.health_report`): not "ok" is a 503.
        body = ctx.client.health_report()
        status = HTTPStatus.OK if body["status"] == "ok" else HTTPStatus.SERVICE_UNAVAILABLE
        return JSONResponse(body, status_code=status)

    async def metrics() -> Response:
        # A pipeline's stages answer between their steps (blocks: off the event loop).
        await asyncio.to_thread(ctx.client.refresh_stage_stats)
        return Response(ctx.metrics.render(), media_type=ctx.metrics.content_type)

    router.add_api_route("/health", health, methods=["GET"])
    router.add_api_route("/metrics", metrics, methods=["GET"])


class Server(uvicorn.Server):
    """uvicorn's server, aborting every in-flight request when it is told to stop."""

    def __init__(self, config: uvicorn.Config, client: EngineClient) -> None:
        super().__init__(config)
        self.client = client

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.client.begin_shutdown()
        await super().shutdown(sockets)


def serve(
    model: str | None,
    engine_args: dict[str, Any],
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    served_model_names: Sequence[str] | None = None,
    log_level: str = "info",
    deploy: str | None = None,
    in_process: bool = False,
    launched: LaunchedWorker | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    slow_clients: SlowClientLimits | None = None,
    ui: bool = False,
) -> int:
    """Load `model` and serve it until SIGINT / SIGTERM (what `omnistage serve` runs).
    A multi-stage deploy (`deploy`, or the packaged one of a demo / pipeline checkpoint
    `model`) is served through an `AsyncOmni` (`in_process`: all stages in this process;
    `engine_args` do not apply: each stage's come from the deploy); anything else (None:
    the default model) as one `LLMEngine` (adopting `launched`, its runner worker started
    before this module was imported, see `cli._early_text_worker`). `slow_clients`
    (default `SlowClientLimits()`): the header and body timeouts, the connection cap.
    `ui`: also serve the playground page at /ui/."""
    slow_clients = slow_clients or SlowClientLimits()
    client: EngineClient
    spec = pipeline_deploy(model, deploy)
    if spec is not None:
        client = PipelineClient(spec, in_process=in_process)
        default_name = model if model is not None else spec.name
    else:
        model = model or DEFAULT_MODEL
        default_name = model
        # The runner worker process inherits an ignored SIGINT, so Ctrl-C in a terminal (sent
        # to the whole process group) reaches only this process, which then shuts it down.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            from omnistage.engine.llm_engine import LLMEngine

            engine = LLMEngine(EngineConfig(model=model, **engine_args), launched)
        finally:
            signal.signal(signal.SIGINT, previous)
        client = AsyncEngineClient(engine, stage="llm")
    app = build_app(
        client,
        list(served_model_names or [default_name]),
        model_path=model,
        api_key=api_key,
        max_request_bytes=max_request_bytes,
        slow_clients=slow_clients,
        ui=ui,
    )
    config = server_config(app, slow_clients, host=host, port=port, log_level=log_level)
    # uvicorn re-raises the signal that stopped it once it is done; by then the shutdown was
    # graceful, so the handlers it restores just let `serve` return.
    handled = (signal.SIGINT, signal.SIGTERM)
    previous_handlers = {sig: signal.signal(sig, _after_shutdown) for sig in handled}
    try:
        Server(config, client).run()
    finally:
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
    return 0


def _after_shutdown(signum: int, frame: Any) -> None:
    logger.info("stopped by signal %d", signum)
