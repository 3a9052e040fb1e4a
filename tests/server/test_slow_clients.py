"""Slow clients lose their connection in bounded time (entrypoints/openai/slow_clients.py),
on raw sockets against the real app and uvicorn config on 127.0.0.1, with the timeouts
shortened: a connection without a complete request header (silent, half a header, or a
header trickled a byte at a time) is closed; a body that stalls or trickles is a 408;
a stream that lasts longer than both timeouts is not cut; a flood of idle sockets gets
503s only until their header timeout; and the server serves normally afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from fastapi import Request, WebSocket
from fastapi.responses import StreamingResponse
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from omnistage.config import EngineConfig
from omnistage.engine.llm_engine import LLMEngine
from omnistage.entrypoints.openai.api_server import Server, build_app
from omnistage.entrypoints.openai.engine_client import AsyncEngineClient
from omnistage.entrypoints.openai.slow_clients import SlowClientLimits, server_config

LIMITS = SlowClientLimits(header_timeout_s=0.5, read_timeout_s=1.0, max_connections=6)
LATE = 3.0
"""A connection the server should have closed after 0.5-1 s still open this long: a failure."""


@pytest.fixture(scope="module")
def url(tiny_llama) -> Iterator[str]:
    client = AsyncEngineClient(LLMEngine(EngineConfig(str(tiny_llama), max_model_len=64)))
    app = build_app(client, ["tiny"], slow_clients=LIMITS)

    async def slow_stream(request: Request) -> StreamingResponse:
        """Reads its body, then sends an event every 0.4 s: 2 s, past both timeouts."""
        count = (await request.json())["events"]

        async def events() -> AsyncIterator[str]:
            for i in range(count):
                await asyncio.sleep(0.4)
                yield f"data: {i}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def echo(websocket: WebSocket) -> None:
        await websocket.accept()
        while True:
            await websocket.send_text(await websocket.receive_text())

    app.add_api_route("/slow-stream", slow_stream, methods=["POST"])
    app.add_api_websocket_route("/echo", echo)
    sock = socket.create_server(("127.0.0.1", 0))
    config = server_config(app, LIMITS, log_level="warning", timeout_graceful_shutdown=10)
    server = Server(config, client)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(30)
    sock.close()


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=LATE)


def _closed_after(conn: socket.socket, start: float, trickle: bytes = b"") -> tuple[float, bytes]:
    """Seconds from `start` until the server closes `conn` (sending `trickle` a byte every
    0.1 s meanwhile); fails past `LATE`. Returns what the server said before closing."""
    conn.settimeout(0.1)
    said = b""
    for i in range(int(LATE / 0.1)):
        try:
            chunk = conn.recv(65536)
        except TimeoutError:
            chunk = None
        except ConnectionResetError:  # closed hard: the same end, later bytes unread
            chunk = b""
        if chunk is not None:
            if not chunk:
                conn.close()
                return time.monotonic() - start, said
            said += chunk
        # Once the server has answered it closes: a byte sent then would come back as a
        # reset that can drop the answer from the socket's buffer before it is read.
        if trickle and not said:
            with contextlib.suppress(OSError):  # the server may close between two bytes
                conn.sendall(trickle[i % len(trickle) : i % len(trickle) + 1])
    raise AssertionError(f"still open after {LATE} s; the server said {said!r}")


def _completion(url: str) -> httpx.Response:
    body = {"model": "tiny", "prompt": "abc", "max_tokens": 3}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=30)


def test_a_request_header_not_complete_in_time_loses_its_connection(url):
    start = time.monotonic()
    silent, half, trickled = _connect(url), _connect(url), _connect(url)
    half.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Ty")
    trickled.sendall(b"GET /health HTTP/1.1\r\nX-Slow: ")
    # The trickled one first, trickling from the start; the others are closed meanwhile.
    for conn, trickle in ((trickled, b"abcdefgh"), (silent, b""), (half, b"")):
        seconds, said = _closed_after(conn, start, trickle)
        assert 0.4 < seconds < 2.0 and said == b"", (seconds, said)  # not one timeout a byte
    assert _completion(url).status_code == 200


def _stalled_body(url: str, sent: bytes, trickle: bytes) -> tuple[float, bytes]:
    conn = _connect(url)
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    conn.sendall(head + b"Content-Length: 1000\r\n\r\n" + sent)
    return _closed_after(conn, time.monotonic(), trickle)


def test_a_body_that_stalls_or_trickles_is_a_408_and_the_server_goes_on(url):
    for sent, trickle in ((b'{"model": "tiny", "pro', b""), (b"", b"          ")):
        seconds, said = _stalled_body(url, sent, trickle)
        assert 0.9 < seconds < 2.5, seconds
        head, _, body = said.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 "), said
        assert b"connection: close" in head.lower()
        error = json.loads(body)["error"]
        assert error["code"] == "request_timeout" and "--read-timeout-s" in error["message"]
    assert _completion(url).status_code == 200


def test_a_stream_longer_than_the_timeouts_is_not_cut(url):
    with httpx.Client(base_url=url, timeout=30) as session:  # one kept-alive connection
        start = time.monotonic()
        with session.stream("POST", "/slow-stream", json={"events": 5}) as response:
            events = [line for line in response.iter_lines() if line]
        assert events == [f"data: {i}" for i in range(5)]
        assert time.monotonic() - start > LIMITS.header_timeout_s + LIMITS.read_timeout_s
        answer = session.post("/v1/completions", json={"model": "tiny", "prompt": "a"})
        assert answer.status_code == 200


def test_idle_sockets_beyond_max_connections_get_503s_until_their_header_timeout(url):
    idle = [_connect(url) for _ in range(LIMITS.max_connections)]
    time.sleep(0.1)  # all accepted
    refused = _completion(url)  # at once, not after a wait
    assert refused.status_code == 503 and refused.headers["connection"] == "close"
    error = refused.json()["error"]  # OpenAI's shape, not uvicorn's plain text
    assert error["type"] == "server_error" and "limit" in error["message"]
    start = time.monotonic()
    for conn in idle:
        _closed_after(conn, start)
    assert _completion(url).status_code == 200


def test_limits_are_checked_by_name():
    for field, value in (
        ("header_timeout_s", 0),
        ("read_timeout_s", float("inf")),
        ("min_body_bytes_per_s", -1),
        ("max_connections", 1),
    ):
        with pytest.raises(ValueError, match=field):
            SlowClientLimits(**{field: value})


def test_a_websocket_outlives_the_header_timeout(url):
    """The header timer stops at the upgrade: it used to close a WebSocket (/v1/realtime)
    `header_timeout_s` after it opened."""
    with connect(url.replace("http", "ws") + "/echo", open_timeout=10) as ws:
        for i in range(4):  # 2 s, 4x the header timeout
            time.sleep(0.5)
            ws.send(f"ping {i}")
            assert ws.recv(5) == f"ping {i}"


def test_websockets_count_as_connections_and_one_beyond_the_cap_is_a_503(url):
    ws_url = url.replace("http", "ws") + "/echo"
    with contextlib.ExitStack() as stack:
        # the cap counts the connection asking, as for a request (`_capped`)
        for _ in range(LIMITS.max_connections - 1):
            stack.enter_context(connect(ws_url, open_timeout=10))
        with pytest.raises(InvalidStatus) as refused:
            connect(ws_url, open_timeout=10)
        assert refused.value.response.status_code == 503
        assert b"its limit" in refused.value.response.body
        assert _completion(url).status_code == 503
    deadline = time.monotonic() + 5  # the server sees the sockets close
    while _completion(url).status_code == 503 and time.monotonic() < deadline:
        time.sleep(0.05)
    with connect(ws_url, open_timeout=10) as ws:
        ws.send("again")
        assert ws.recv(5) == "again"
