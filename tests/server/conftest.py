"""The real server (uvicorn on a loopback port, in a background thread) for the server tests.

One session server on a tiny random llama serves most tests; `LiveServer` starts
others (smollm2, the fuzz target). `PipelineServer` serves a multi-stage pipeline
(`speech_server`: demo-omni, in process). Tests talk to it with the `openai` client and,
for raw bodies, httpx; they read the engine's counters through `server.client`.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import uvicorn

from omnistage.config import EngineConfig
from omnistage.engine.llm_engine import LLMEngine
from omnistage.entrypoints.openai.api_server import Server, build_app
from omnistage.entrypoints.openai.engine_client import AsyncEngineClient
from omnistage.entrypoints.openai.pipeline_client import PipelineClient
from omnistage.entrypoints.openai.pipeline_deploy import pipeline_deploy

TINY = "tiny"


class _ThreadedServer:
    """`app` served by uvicorn on 127.0.0.1:<free port> in a background thread."""

    def __init__(self, app: Any, client: Any) -> None:
        self.app, self.client = app, client
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=10)
        self.server = Server(config, client)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    def __enter__(self):
        self._thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(30)
        self._sock.close()


class LiveServer(_ThreadedServer):
    """`build_app` over a fresh engine."""

    def __init__(
        self,
        model: str,
        name: str,
        api_key: str | None = None,
        max_request_bytes: int | None = None,
        ui: bool = False,
        **engine_args: Any,
    ):
        engine = LLMEngine(EngineConfig(model=model, **engine_args))
        client = AsyncEngineClient(engine)
        self.name = name
        limit = {} if max_request_bytes is None else {"max_request_bytes": max_request_bytes}
        app = build_app(client, [name], model_path=model, api_key=api_key, ui=ui, **limit)
        super().__init__(app, client)

    def openai(self, **kwargs: Any) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.url}/v1",
            api_key=kwargs.pop("api_key", "none"),
            max_retries=0,
            timeout=60,
            **kwargs,
        )

    def wait_idle(self, timeout: float = 20.0) -> None:
        """Until the engine holds no request and no KV block (fails after `timeout`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            stats = self.client.fresh_stats()
            if stats.num_unfinished == 0 and stats.kv_blocks_used == 0:
                return
            time.sleep(0.05)
        raise AssertionError(f"the engine still holds requests: {stats}")


class PipelineServer(_ThreadedServer):
    """`build_app` over a `PipelineClient` of `model` (its stages in this process)."""

    def __init__(self, model: str, ui: bool = False) -> None:
        spec = pipeline_deploy(model, None)
        assert spec is not None and spec.is_pipeline
        client = PipelineClient(spec, in_process=True)
        self.name = model
        super().__init__(build_app(client, [model], model_path=model, ui=ui), client)

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        assert self.client._closed  # the lifespan stopped the pipeline

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", max_retries=0, timeout=120)

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Until the pipeline tracks no request and every stage's counters are zero."""
        deadline = time.monotonic() + timeout
        counters: Any = None
        while time.monotonic() < deadline:
            if self.client.omni.orchestrator.num_tracked() == 0:
                counters = self.client.stats()
                if all(v == 0 for stage in counters.values() for v in stage.values()):
                    return
            time.sleep(0.1)
        raise AssertionError(f"the pipeline still holds requests: {counters}")


def record_calls(
    server: PipelineServer, monkeypatch: pytest.MonkeyPatch, method: str, pick: Any
) -> list[Any]:
    """`pick(*args)` of every call of the server's orchestrator `method` from now on."""
    orchestrator = server.client.omni.orchestrator
    calls: list[Any] = []
    original = getattr(orchestrator, method)

    def recording(*args: Any) -> Any:
        calls.append(pick(*args))
        return original(*args)

    monkeypatch.setattr(orchestrator, method, recording)
    return calls


def record_voices(server: PipelineServer, monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """The voice of every request the server's pipeline receives from now on, in order."""
    return record_calls(server, monkeypatch, "submit", lambda request, sink: request.voice)


def record_aborts(server: PipelineServer, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The id of every request the server's pipeline is asked to abort from now on."""
    return record_calls(server, monkeypatch, "abort", lambda request_id: request_id)


@pytest.fixture(scope="session")
def speech_server() -> Iterator[PipelineServer]:
    """demo-omni (thinker -> talker -> code2wav), shared by the pipeline test modules."""
    with PipelineServer("demo-omni") as live:
        yield live


@pytest.fixture(scope="session")
def server(tiny_llama) -> Iterator[LiveServer]:
    with LiveServer(str(tiny_llama), TINY, max_model_len=256, max_num_seqs=32) as live:
        yield live


@pytest.fixture
def client(server: LiveServer) -> openai.OpenAI:
    return server.openai()


@pytest.fixture
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as session:
        yield session
