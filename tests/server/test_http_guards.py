"""The guards in front of every route (entrypoints/openai/http_guards.py): with an API key
nothing but /health and /metrics answers without it (FastAPI's /docs, /redoc and
/openapi.json included); a body over the limit is a 413 naming it, declared or chunked,
and the server goes on serving."""

from __future__ import annotations

import httpx
import pytest
from fastapi import WebSocket
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.server.conftest import LiveServer

KEY = "sesame"
LIMIT = 4096


@pytest.fixture(scope="module")
def guarded(tiny_llama):
    with LiveServer(str(tiny_llama), "guarded", api_key=KEY, max_request_bytes=LIMIT) as s:
        yield s


def _chat(text: str) -> dict:
    return {"model": "guarded", "messages": [{"role": "user", "content": text}], "max_tokens": 2}


def test_every_route_but_health_and_metrics_wants_the_key(guarded):
    for path in ("/docs", "/redoc", "/openapi.json", "/v1/models", "/no/such/route"):
        answer = httpx.get(guarded.url + path)
        assert answer.status_code == 401, path
        assert answer.json()["error"]["code"] == "invalid_api_key"
    auth = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(guarded.url + "/openapi.json", headers=auth).status_code == 200
    assert httpx.get(guarded.url + "/health").status_code == 200
    assert httpx.get(guarded.url + "/metrics").status_code == 200


def test_a_body_over_the_limit_is_a_413_and_the_server_goes_on(guarded):
    auth = {"Authorization": f"Bearer {KEY}"}
    url = guarded.url + "/v1/chat/completions"
    declared = httpx.post(url, json=_chat("x" * 2 * LIMIT), headers=auth)
    assert declared.status_code == 413
    error = declared.json()["error"]
    assert error["code"] == "request_too_large" and str(LIMIT) in error["message"]

    def chunks():  # no Content-Length: the body is counted as it arrives
        body = httpx.Request("POST", url, json=_chat("y" * 2 * LIMIT)).content
        for i in range(0, len(body), 1024):
            yield body[i : i + 1024]

    chunked = httpx.post(url, content=chunks(), headers=auth | {"Content-Type": "application/json"})
    assert chunked.status_code == 413 and "and more" in chunked.json()["error"]["message"]
    ok = httpx.post(url, json=_chat("hello"), headers=auth, timeout=60)
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] is not None


def test_a_websocket_upgrade_wants_the_key(guarded):
    async def echo(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text("open")
        await websocket.close()

    guarded.app.add_api_websocket_route("/ws-probe", echo)
    url = guarded.url.replace("http", "ws") + "/ws-probe"
    with pytest.raises(InvalidStatus) as refused:
        connect(url, open_timeout=10)
    assert refused.value.response.status_code == 403
    with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        assert ws.recv(10) == "open"


def test_a_limit_below_one_byte_is_refused(tiny_llama):
    with pytest.raises(ValueError, match="max_request_bytes"):
        LiveServer(str(tiny_llama), "x", max_request_bytes=0)
