"""The OpenAI server over demo-omni (thinker -> talker -> code2wav), beyond chat and speech:
the thinker's context length (400s before anything runs), `usage.prompt_tokens` as the
thinker receives them, per-stage gauges in /metrics, and /v1/completions (the thinker's
text for raw prompts). Real server on a loopback port, real `openai` client; the
session's `speech_server` (stages in process, so the tests can look at the thinker)."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.server.conftest import PipelineServer

MODEL = "demo-omni"
HELLO = [{"role": "user", "content": "Say hello."}]


def _error(exc: pytest.ExceptionInfo[openai.APIStatusError]) -> dict[str, Any]:
    return exc.value.response.json()["error"]


def _thinker_engine(server: PipelineServer) -> Any:
    return server.client.omni.orchestrator.clients["thinker"].core.engine


def _record_prompt_lengths(server: PipelineServer, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length of every prompt the thinker's engine is given from now on."""
    engine = _thinker_engine(server)
    lengths: list[int] = []
    if hasattr(engine, "add_tokenized_request"):  # an LLMEngine: (request_id, text, ids, ...)
        name, position = "add_tokenized_request", 2
    else:  # a stage engine: (request_id, ids, ...)
        name, position = "add_request", 1
    original = getattr(engine, name)

    def recording(*args: Any, **kwargs: Any) -> Any:
        lengths.append(len(args[position]))
        return original(*args, **kwargs)

    monkeypatch.setattr(engine, name, recording)
    return lengths


def test_context_length_is_the_thinker_s(speech_server: PipelineServer) -> None:
    limit = speech_server.client.max_model_len
    assert limit == _thinker_engine(speech_server).config.max_model_len == 4096
    card = httpx.get(f"{speech_server.url}/v1/models").json()["data"][0]
    assert card["max_model_len"] == limit


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_prompt_plus_max_tokens_over_the_context_is_400(
    speech_server: PipelineServer, field: str
) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        speech_server.openai().chat.completions.create(
            model=MODEL, messages=HELLO, modalities=["text"], **{field: 4096}
        )
    error = _error(exc)
    assert error["param"] == field
    assert field in error["message"] and "context length of 4096" in error["message"]
    assert speech_server.client.omni.orchestrator.num_tracked() == 0  # nothing was started


def test_prompt_over_the_context_is_400(speech_server: PipelineServer) -> None:
    long = [{"role": "user", "content": "hello " * 5000}]
    with pytest.raises(openai.BadRequestError) as exc:
        speech_server.openai().chat.completions.create(model=MODEL, messages=long, max_tokens=2)
    error = _error(exc)
    assert error["param"] == "messages" and "context length of 4096" in error["message"]
    with pytest.raises(openai.BadRequestError) as exc:
        speech_server.openai().completions.create(model=MODEL, prompt="hello " * 5000)
    assert _error(exc)["param"] == "prompt"


def test_usage_counts_the_thinker_s_prompt(
    speech_server: PipelineServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    lengths = _record_prompt_lengths(speech_server, monkeypatch)
    messages = [
        {"role": "system", "content": "You are terse."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Say hello "}, {"type": "text", "text": "twice."}],
        },
    ]
    client = speech_server.openai()
    reply = client.chat.completions.create(
        model=MODEL, messages=messages, modalities=["text"], max_tokens=3
    )
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    streamed = [chunk.usage for chunk in stream if chunk.usage is not None]
    assert reply.usage is not None and len(streamed) == 1
    assert lengths == [reply.usage.prompt_tokens, streamed[0].prompt_tokens]
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    speech_server.wait_idle()


def _samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_metrics_have_every_stage_s_gauges(speech_server: PipelineServer) -> None:
    speech_server.openai().chat.completions.create(
        model=MODEL,
        messages=HELLO,
        modalities=["text", "audio"],
        audio={"format": "wav", "voice": "ethan"},
        max_tokens=3,
    )
    speech_server.wait_idle()
    samples = _samples(httpx.get(f"{speech_server.url}/metrics").text)
    for stage in ("thinker", "talker", "code2wav"):
        for gauge in ("num_requests_waiting", "num_requests_running", "kv_cache_usage_ratio"):
            assert samples[f'omnistage_{gauge}{{stage="{stage}"}}'] == 0  # idle again


def test_metrics_show_a_running_request(speech_server: PipelineServer) -> None:
    """While a long reply is written, the thinker's gauges say so."""
    body = {
        "model": MODEL,
        "messages": HELLO,
        "max_tokens": 4000,
        "ignore_eos": True,
        "stream": True,
    }
    seen = []
    with (
        httpx.Client(base_url=speech_server.url, timeout=60) as http,
        http.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200  # the thinker has started writing
        for _ in range(20):
            samples = _samples(http.get("/metrics").text)
            seen.append(
                (
                    samples['omnistage_num_requests_running{stage="thinker"}'],
                    samples['omnistage_kv_cache_usage_ratio{stage="thinker"}'],
                )
            )
            if seen[-1][0]:
                break
        # What the pipeline holds for it: the orchestrator's entry, the thinker's.
        held = _samples(http.get("/metrics").text)
        assert held["omnistage_pipeline_open_requests"] == 1
        thinker = 'omnistage_stage_resources_held{resource="%s",stage="thinker"}'
        assert held[thinker % "engine_requests"] == 1 and held[thinker % "kv_blocks_used"] > 0
    running, kv_usage = seen[-1]
    assert running == 1 and 0 < kv_usage <= 1, seen
    speech_server.wait_idle()
    samples = _samples(httpx.get(f"{speech_server.url}/metrics").text)
    assert samples["omnistage_pipeline_open_requests"] == 0
    held = {k: v for k, v in samples.items() if k.startswith("omnistage_stage_resources_held")}
    assert len(held) >= 9 and set(held.values()) == {0.0}, held  # every stage's, all free


# -- /v1/completions --------------------------------------------------------------------------
def test_completions_on_a_pipeline(
    speech_server: PipelineServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    lengths = _record_prompt_lengths(speech_server, monkeypatch)
    client = speech_server.openai()
    reply = client.completions.create(
        model=MODEL, prompt=["Once upon a time", "The sky is"], max_tokens=4, temperature=0
    )
    assert [c.index for c in reply.choices] == [0, 1]
    assert all(
        isinstance(c.text, str) and c.finish_reason in ("stop", "length") for c in reply.choices
    )
    assert reply.usage is not None and sorted(lengths) == sorted(
        len(speech_server.client.tokenizer.encode(p)) for p in ["Once upon a time", "The sky is"]
    )
    assert reply.usage.prompt_tokens == sum(lengths)
    assert 0 < reply.usage.completion_tokens <= 8

    # the same greedy prompt streamed: the same text, then the usage
    pieces, finish, usage = [], None, None
    for chunk in client.completions.create(
        model=MODEL,
        prompt="Once upon a time",
        max_tokens=4,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ):
        usage = chunk.usage or usage
        for choice in chunk.choices:
            pieces.append(choice.text)
            finish = choice.finish_reason or finish
    assert "".join(pieces) == reply.choices[0].text and finish == reply.choices[0].finish_reason
    assert usage is not None and usage.prompt_tokens == lengths[-1]  # the streamed one

    ids = speech_server.client.tokenizer.encode("Once upon a time")
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=4, temperature=0)
    assert by_ids.choices[0].text == reply.choices[0].text
    echoed = client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, echo=True)
    assert echoed.choices[0].text.startswith("Hi")
    speech_server.wait_idle()


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 2}, "n"),
        ({"logprobs": 1}, "logprobs"),
        ({"suffix": "x"}, "suffix"),
        ({"max_tokens": 4096}, "max_tokens"),
    ],
)
def test_completions_errors(
    speech_server: PipelineServer, extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        speech_server.openai().completions.create(model=MODEL, prompt="hi", **extra)
    assert _error(exc)["param"] == param
    assert speech_server.client.omni.orchestrator.num_tracked() == 0
