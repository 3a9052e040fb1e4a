"""POST /v1/audio/speech over CosyVoice3 (the built-in demo-cosyvoice3: LM -> token2wav)
with the real server and the real `openai` client: the checkpoint's voices speak, whole
and streamed (uploaded voices: `test_cosyvoice3_voices.py`); bad input is a 400 naming
the field and the server goes on serving."""

from __future__ import annotations

import io
from collections.abc import Iterator

import numpy as np
import openai
import pytest
import soundfile

from tests.server.conftest import PipelineServer

MODEL = "demo-cosyvoice3"


@pytest.fixture(scope="module")
def server() -> Iterator[PipelineServer]:
    with PipelineServer(MODEL) as live:
        yield live


def test_voices_speak_whole_and_streamed(server: PipelineServer) -> None:
    client = server.openai()
    demo = client.audio.speech.create(model=MODEL, input="Hello.", voice="demo").content
    samples, rate = soundfile.read(io.BytesIO(demo), dtype="int16")
    assert rate == 24000 and samples.size > 0
    bright = client.audio.speech.create(model=MODEL, input="Hello.", voice="Bright").content
    other = soundfile.read(io.BytesIO(bright), dtype="int16")[0]
    assert other.size != samples.size or not np.array_equal(other, samples)
    with client.audio.speech.with_streaming_response.create(
        model=MODEL, input="A streamed sentence.", voice="demo", extra_body={"stream": True}
    ) as response:
        data = b"".join(response.iter_bytes(4096))
    assert data[:4] == b"RIFF" and len(data) > 44
    server.wait_idle()


def test_bad_input_is_a_400(server: PipelineServer) -> None:
    client = server.openai()
    for param, kwargs in (
        ("voice", dict(input="hi", voice="alloy")),
        ("input", dict(input="   ", voice="demo")),
        ("voice", dict(input="hi", voice="voice-0123456789abcdef")),  # no such upload
    ):
        with pytest.raises(openai.BadRequestError) as exc:
            client.audio.speech.create(model=MODEL, **kwargs)
        assert exc.value.response.json()["error"]["param"] == param
    after = client.audio.speech.create(model=MODEL, input="Still here.", voice="demo").content
    assert soundfile.read(io.BytesIO(after))[0].size > 0
    server.wait_idle()
