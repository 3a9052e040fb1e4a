"""A pipeline server while one of its stages restarts (issue 22): the tiny thinker -> talker
-> vocoder pipeline with a process per stage, its talker killed. Meanwhile GET /health is a 503 saying `degraded` with the
talker `restarting`, a request that needs the talker is a 503 whose message names it, and a
text-only request is served; once the talker is back /health is 200 `ok`, /metrics counts
the restart, and the request that needs it is served again."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import httpx
import pytest

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.pipeline_client import PipelineClient
from omnistage.testing.tiny_pipeline import make_tiny_omni, tiny_pipeline_deploy
from tests.server.conftest import _ThreadedServer

MODEL = "tiny-omni"
HELLO = [{"role": "user", "content": "Say hello."}]
SPEECH = {"modalities": ["text", "audio"]}


def _chat(http: httpx.Client, **extra: Any) -> httpx.Response:
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 4, "temperature": 0, **extra}
    return http.post("/v1/chat/completions", json=body)


def _wait_for(http: httpx.Client, status: str, timeout: float = 60.0) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        response = http.get("/health")
        if response.json().get("status") == status:
            return response
        assert time.monotonic() < deadline, response.json()
        time.sleep(0.05)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = make_tiny_omni(tmp_path_factory.mktemp("tiny-omni"))
    deploy = tiny_pipeline_deploy(model)
    deploy["stages"][1]["restart"] = {"backoff_s": 3.0}  # time to look at the server meanwhile
    client = PipelineClient(deploy)
    app = build_app(client, [MODEL], model_path=str(model / "thinker"))
    with _ThreadedServer(app, client) as live:
        yield live


def test_health_is_degraded_while_a_stage_restarts_and_its_requests_are_503s(server):
    http = httpx.Client(base_url=server.url, timeout=60)
    health = http.get("/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert _chat(http, **SPEECH).status_code == 200
    os.kill(server.client.omni.orchestrator.clients["talker"].pid, signal.SIGKILL)

    degraded = _wait_for(http, "degraded", timeout=5)
    assert degraded.status_code == 503
    talker = degraded.json()["stages"]["talker"]
    assert talker["state"] == "restarting" and talker["failures"] == 1
    assert "stage 'talker' died (exit code -9)" in talker["reason"]
    assert degraded.json()["stages"]["thinker"]["state"] == "up"
    refused = _chat(http, **SPEECH)
    assert refused.status_code == 503
    message = refused.json()["error"]["message"]
    assert "stage 'talker' died (exit code -9); restarting it (try 1 of 3)" in message
    assert _chat(http, modalities=["text"]).status_code == 200  # the rest serves on

    assert _wait_for(http, "ok").status_code == 200
    metrics = http.get("/metrics").text
    assert 'omnistage_stage_restarts_total{stage="talker"} 1.0' in metrics
    assert 'omnistage_stage_failures_total{stage="talker"} 1.0' in metrics
    assert 'omnistage_stage_up{stage="talker"} 1.0' in metrics
    assert _chat(http, **SPEECH).status_code == 200
