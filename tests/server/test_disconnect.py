"""A client that goes away aborts its request: the engine frees every KV block."""

from __future__ import annotations

import httpx
import pytest

from tests.server.conftest import TINY

# The tiny model is fast (~1 ms a step): enough samples that a request takes well over
# the time a disconnect needs to reach the engine (n samples share each step, 32 at most).
LONG = {"max_tokens": 220, "ignore_eos": True, "temperature": 1.0}


def _aborted(server) -> float:
    metrics = server.client.observer
    return metrics.requests_finished.labels("llm", "abort")._value.get()


def _engine_is_clean(server) -> None:
    server.wait_idle(timeout=5)
    engine = server.client.engine
    assert engine.num_free_kv_blocks() == engine.num_usable_kv_blocks()
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_disconnect_mid_stream_aborts(server, path):
    if "chat" in path:
        body = {"model": TINY, "messages": [{"role": "user", "content": "hi"}], "n": 32}
    else:
        body = {"model": TINY, "prompt": ["a", "b"], "n": 16}
    body |= {"stream": True, **LONG}
    aborted = _aborted(server)
    with (
        httpx.Client(base_url=server.url, timeout=30) as http,
        http.stream("POST", path, json=body) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()
        events = [line for line, _ in zip(lines, range(12), strict=False) if line]
        assert all(e.startswith("data: {") for e in events)
        assert server.client.fresh_stats().num_unfinished >= 1  # still generating
    _engine_is_clean(server)
    assert _aborted(server) == aborted + (1 if "chat" in path else 2)
    stats = server.client.fresh_stats()
    assert stats.num_waiting == stats.num_running == 0


def test_disconnect_while_waiting_for_a_whole_answer_aborts(server):
    body = {"model": TINY, "prompt": "abc", **LONG, "n": 128}  # seconds of work
    aborted = _aborted(server)
    with httpx.Client(base_url=server.url, timeout=0.3) as http, pytest.raises(httpx.ReadTimeout):
        http.post("/v1/completions", json=body)
    _engine_is_clean(server)
    assert _aborted(server) == aborted + 1


def test_many_streams_dropped_at_once(server):
    aborted = _aborted(server)
    clients = [httpx.Client(base_url=server.url, timeout=30) for _ in range(6)]
    streams = []
    try:
        for i, http in enumerate(clients):
            body = {"model": TINY, "prompt": f"prompt {i}", "stream": True, "n": 8, **LONG}
            stream = http.stream("POST", "/v1/completions", json=body)
            response = stream.__enter__()
            next(response.iter_lines())
            streams.append(stream)
    finally:
        for stream in streams:
            stream.__exit__(None, None, None)
        for http in clients:
            http.close()
    _engine_is_clean(server)
    assert _aborted(server) == aborted + 6
    # and the server still answers
    with httpx.Client(base_url=server.url, timeout=30) as http:
        ok = http.post("/v1/completions", json={"model": TINY, "prompt": "x", "max_tokens": 2})
        assert ok.status_code == 200
