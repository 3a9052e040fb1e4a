"""The text server when the model fails on one request (issue 22): that request answers a
500 in OpenAI's error shape (a stream: an error event with type, param and code), the
requests sharing its steps are answered as if it had not been there, and the engine
serves on. The runner is made to raise whenever a prompt starting with `BAD` is in a
step (`step_isolation` finds it by running the failed step's requests alone)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.server.conftest import LiveServer

BAD = 299
GOOD = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16], [17, 18]]


@pytest.fixture(scope="module")
def failing_server(tiny_llama):
    with LiveServer(str(tiny_llama), "tiny", max_model_len=128, async_scheduling=False) as live:
        runner = live.client.engine.core.executor.runner
        execute = runner.execute_model
        bad: set[str] = set()

        def execute_model(so: Any) -> Any:
            bad.update(r.req_id for r in so.scheduled_new_reqs if r.prompt_token_ids[0] == BAD)
            if bad & set(so.num_scheduled_tokens):
                raise RuntimeError("the model failed")
            return execute(so)

        runner.execute_model = execute_model
        yield live


def _complete(url: str, prompt: list[int], stream: bool = False) -> httpx.Response:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 16, "temperature": 0}
    body |= {"ignore_eos": True, "stream": stream}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=60)


def test_a_request_the_model_fails_on_is_a_500_and_the_rest_are_served(failing_server):
    url = failing_server.url
    alone = [_complete(url, p).json()["choices"][0]["text"] for p in GOOD]
    prompts = [*GOOD[:2], [BAD, 1, 2], *GOOD[2:]]
    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(lambda p: _complete(url, p), prompts))
    failed = answers.pop(2)
    assert failed.status_code == 500
    error = failed.json()["error"]
    assert (
        error["type"] == "server_error" and "the model failed on this request" in error["message"]
    )
    assert "RuntimeError" not in error["message"]  # the cause stays in the server log
    assert [a.status_code for a in answers] == [200] * len(GOOD)
    assert [a.json()["choices"][0]["text"] for a in answers] == alone
    stats = failing_server.client.fresh_stats()
    assert stats.num_unfinished == 0 and stats.kv_blocks_used == 0


def test_a_stream_the_model_fails_on_ends_with_an_error_event(failing_server):
    response = _complete(failing_server.url, [BAD, 3, 4], stream=True)
    assert response.status_code == 200
    events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    error = json.loads(events[-2] if events[-1] == "[DONE]" else events[-1])["error"]
    assert error["code"] == 500 and error["type"] == "server_error" and "param" in error
    assert _complete(failing_server.url, GOOD[0]).status_code == 200
