"""POST /v1/chat/completions over Ming-Omni (the built-in demo-ming-omni: thinker -> talker)
with the real server and the real `openai` client: a text answer, whole and streamed;
bad input is a 400 in the OpenAI error shape naming the field (audio out among it: the
deploy has no vocoder stage yet, so speech ids are not audio), and the server goes on
serving."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.server.conftest import PipelineServer

MODEL = "demo-ming-omni"
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def server() -> Iterator[PipelineServer]:
    with PipelineServer(MODEL) as live:
        yield live


def test_text_answer_whole_and_streamed(server: PipelineServer) -> None:
    client = server.openai()
    whole = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=6, temperature=0, modalities=["text"]
    )
    assert whole.choices[0].message.content
    stream = client.chat.completions.create(
        model=MODEL,
        messages=HELLO,
        max_tokens=6,
        temperature=0,
        modalities=["text"],
        stream=True,
    )
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(pieces) == whole.choices[0].message.content
    server.wait_idle()


def test_bad_input_is_a_400_naming_the_field(server: PipelineServer) -> None:
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
    after = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=3, modalities=["text"]
    )
    assert after.choices[0].message.content is not None
    server.wait_idle()
