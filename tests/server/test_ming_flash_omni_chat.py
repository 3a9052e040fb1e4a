"""POST /v1/chat/completions over Ming-flash-omni-2.0's thinker (the built-in
demo-ming-flash-omni: one stage serving the checkpoint's `thinker` part) with the real
server and the real `openai` client: a text answer whole, and streamed to the same
text; audio (which this deploy cannot make yet) and other bad input are a 400
in the OpenAI error shape naming the field, `/v1/audio/speech` is not served (a 404 in that
shape), and the server goes on serving."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.server.conftest import PipelineServer

MODEL = "demo-ming-flash-omni"
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def server() -> Iterator[PipelineServer]:
    with PipelineServer(MODEL) as live:
        yield live


def test_text_answer_whole_and_streamed(server: PipelineServer) -> None:
    client = server.openai()
    whole = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=6, temperature=0)
    assert whole.choices[0].message.content
    assert whole.usage.completion_tokens == 6
    stream = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=6, temperature=0, stream=True
    )
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(pieces) == whole.choices[0].message.content
    server.wait_idle()


def test_audio_and_bad_input_are_400s_naming_the_field(server: PipelineServer) -> None:
    client = server.openai()
    for param, kwargs in {
        "messages": dict(messages=[]),
        "max_tokens": dict(messages=HELLO, max_tokens=-1),
        "modalities": dict(messages=HELLO, modalities=["text", "audio"]),
    }.items():
        with pytest.raises(openai.BadRequestError) as exc:
            client.chat.completions.create(model=MODEL, **kwargs)
        error = exc.value.response.json()["error"]
        assert error["param"] == param, error
        assert error["type"] == "invalid_request_error"
    speech = httpx.post(
        f"{server.url}/v1/audio/speech", json={"model": MODEL, "input": "hi", "voice": "x"}
    )
    assert speech.status_code == 404, speech.text  # no speaking stage: not served
    assert speech.json()["error"]["type"] == "invalid_request_error"
    after = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=3)
    assert after.choices[0].message.content is not None
    server.wait_idle()
