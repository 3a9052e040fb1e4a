"""One serving path: the same bad request gets the same 4xx, naming the same field, from
a text model (the session's tiny llama) and from a pipeline (demo-omni, whose thinker
refuses what the text engine refuses: it used to be a 500 there); the same good request
gets answers of the same shape. Real servers on loopback ports, raw HTTP."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.server.conftest import LiveServer, PipelineServer

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
HELLO = [{"role": "user", "content": "Say hello."}]
FAR = 2**31 - 1
"""A token id inside the request bounds but outside every vocabulary."""

BAD_REQUESTS: list[tuple[str, dict[str, Any], int, str | None]] = [
    (COMPLETIONS, {"prompt": [FAR]}, 400, "prompt"),
    (COMPLETIONS, {"prompt": "hi", "stop_token_ids": [FAR]}, 400, "stop_token_ids"),
    (CHAT, {"messages": HELLO, "stop_token_ids": [FAR]}, 400, "stop_token_ids"),
    (CHAT, {"messages": HELLO, "logit_bias": {str(FAR): 1.0}}, 400, "logit_bias"),
    (CHAT, {"messages": HELLO, "max_tokens": 2, "min_tokens": 3}, 400, "min_tokens"),
    (CHAT, {"messages": HELLO, "max_completion_tokens": 10**6}, 400, "max_completion_tokens"),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 10**6}, 400, "max_tokens"),
    (COMPLETIONS, {"prompt": "hello " * 5000}, 400, "prompt"),
    (CHAT, {"messages": [{"role": "user", "content": "hello " * 5000}]}, 400, "messages"),
    (CHAT, {"messages": HELLO, "stream_options": {"include_usage": True}}, 400, "stream_options"),
    (
        CHAT,
        {"messages": HELLO, "tools": [{"type": "function", "function": {"name": "f"}}]},
        400,
        "tools",
    ),
    (CHAT, {"messages": HELLO, "response_format": {"type": "json_object"}}, 400, "response_format"),
    (COMPLETIONS, {"prompt": "hi", "suffix": "x"}, 400, "suffix"),
    (CHAT, {"messages": HELLO, "temperature": -1}, 400, "temperature"),
    (CHAT, {"messages": HELLO, "bogus": 1}, 400, "bogus"),
]


def _post(server: LiveServer | PipelineServer, path: str, body: dict[str, Any]) -> httpx.Response:
    with httpx.Client(base_url=server.url, timeout=60) as http:
        return http.post(path, json={"model": server.name, **body})


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    BAD_REQUESTS,
    ids=[f"{'chat' if p == CHAT else 'completions'}-{param}" for p, _, _, param in BAD_REQUESTS],
)
def test_the_same_bad_request_gets_the_same_4xx(
    server: LiveServer,
    speech_server: PipelineServer,
    path: str,
    body: dict[str, Any],
    status: int,
    param: str | None,
) -> None:
    for live in (server, speech_server):
        answer = _post(live, path, body)
        assert answer.status_code == status, (type(live).__name__, answer.text)
        error = answer.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == param, error
        assert error["message"].startswith(f"{param}"), error
    assert speech_server.client.omni.orchestrator.num_tracked() == 0
    server.wait_idle()


def test_an_unknown_model_is_the_same_404(
    server: LiveServer, speech_server: PipelineServer
) -> None:
    for live in (server, speech_server):
        for path, body in ((CHAT, {"messages": HELLO}), (COMPLETIONS, {"prompt": "hi"})):
            answer = _post(live, path, {**body, "model": "nope"})
            assert answer.status_code == 404
            assert answer.json()["error"]["code"] == "model_not_found"


def _events(live: LiveServer | PipelineServer, path: str, body: dict[str, Any]) -> list[Any]:
    import json

    events = []
    with (
        httpx.Client(base_url=live.url, timeout=60) as http,
        http.stream("POST", path, json={"model": live.name, **body}) as response,
    ):
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_streams_have_the_same_shape(
    server: LiveServer, speech_server: PipelineServer, path: str
) -> None:
    """Role first (chat), text chunks, one finish reason, the usage, then [DONE]; the
    chunks add up to the whole answer of the same greedy request."""
    body: dict[str, Any] = {"max_tokens": 4, "temperature": 0, "ignore_eos": True}
    body |= {"messages": HELLO} if path == CHAT else {"prompt": "Once upon a time"}
    for live in (server, speech_server):
        events = _events(
            live, path, body | {"stream": True, "stream_options": {"include_usage": True}}
        )
        assert events[-1] == "[DONE]"
        usage = events[-2]["usage"]
        assert usage["completion_tokens"] == 4 and usage["prompt_tokens"] > 0
        assert usage["total_tokens"] == usage["prompt_tokens"] + 4
        choices = [c for e in events[:-2] for c in e["choices"]]
        finishes = [c["finish_reason"] for c in choices if c.get("finish_reason")]
        assert finishes == ["length"]
        if path == CHAT:
            assert choices[0]["delta"] == {"role": "assistant", "content": ""}
            streamed = "".join(c["delta"].get("content", "") for c in choices)
        else:
            streamed = "".join(c["text"] for c in choices)
        whole = _post(live, path, body).json()
        cached = ("prompt_tokens_details",)  # the second request may hit the prefix cache
        assert {k: v for k, v in whole["usage"].items() if k not in cached} == {
            k: v for k, v in usage.items() if k not in cached
        }
        choice = whole["choices"][0]
        assert streamed == (choice["message"]["content"] if path == CHAT else choice["text"])
        assert choice["finish_reason"] == "length"
    speech_server.wait_idle()
    server.wait_idle()
