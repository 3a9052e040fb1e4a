"""POST /v1/audio/speech over Ming-Omni's talker alone (the built-in demo-ming-omni-tts:
talker -> vocoder, the talker renders its prompt from the text) with the real server and
the real `openai` client: "luna" (any case) speaks, whole (wav) and
streamed (pcm); bad input is a 400 naming the field (`voice`, `input`, `instructions`)
and the server goes on serving."""

from __future__ import annotations

import io
from collections.abc import Iterator

import openai
import pytest
import soundfile

from tests.server.conftest import PipelineServer

MODEL = "demo-ming-omni-tts"


@pytest.fixture(scope="module")
def server() -> Iterator[PipelineServer]:
    with PipelineServer(MODEL) as live:
        yield live


def test_the_talker_speaks_whole_and_streamed(server: PipelineServer) -> None:
    client = server.openai()
    for voice in ("luna", "LUNA"):
        wav = client.audio.speech.create(model=MODEL, input="Hello there.", voice=voice).content
        samples, rate = soundfile.read(io.BytesIO(wav), dtype="int16")
        assert rate == 22050 and samples.size > 0
    with client.audio.speech.with_streaming_response.create(
        model=MODEL,
        input="A streamed sentence.",
        voice="luna",
        response_format="pcm",
        extra_body={"stream": True},
    ) as response:
        data = b"".join(response.iter_bytes(4096))
    assert len(data) > 0 and len(data) % 2 == 0
    server.wait_idle()


def test_bad_input_is_a_400_naming_the_field(server: PipelineServer) -> None:
    client = server.openai()
    for param, kwargs in (
        ("voice", dict(input="hi", voice="alloy")),
        ("input", dict(input="   ", voice="luna")),
        ("instructions", dict(input="hi", voice="luna", instructions="whisper")),
    ):
        with pytest.raises(openai.BadRequestError) as exc:
            client.audio.speech.create(model=MODEL, **kwargs)
        assert exc.value.response.json()["error"]["param"] == param, param
    after = client.audio.speech.create(model=MODEL, input="Still here.", voice="luna").content
    assert soundfile.read(io.BytesIO(after))[0].size > 0
    server.wait_idle()
