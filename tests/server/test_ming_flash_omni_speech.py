"""POST /v1/audio/speech over Ming-flash-omni-2.0's talker alone (the built-in
demo-ming-flash-omni-tts: talker -> audio VAE, the talker renders its prompt from the
text) with the real server and the real `openai` client: the default voice speaks, whole
(wav at the VAE's rate) and streamed (pcm). The flow head starts from noise at any
temperature, so the same audio twice needs a `seed` (an extension of the endpoint); streamed =
whole is proven offline (tests/pipeline/test_ming_flash_omni_tts_pipeline.py). Bad input is a 400 naming the
field (`voice`, `input`, `instructions`) and the server goes on serving."""

from __future__ import annotations

import io
from collections.abc import Iterator

import numpy as np
import openai
import pytest
import soundfile

from tests.server.conftest import PipelineServer

MODEL = "demo-ming-flash-omni-tts"
RATE = 16000


@pytest.fixture(scope="module")
def server() -> Iterator[PipelineServer]:
    with PipelineServer(MODEL) as live:
        yield live


def test_the_talker_speaks_whole_and_streamed(server: PipelineServer) -> None:
    client = server.openai()
    wav = client.audio.speech.create(model=MODEL, input="Hello there.", voice="default").content
    samples, rate = soundfile.read(io.BytesIO(wav), dtype="int16")
    assert rate == RATE and samples.size > 0
    with client.audio.speech.with_streaming_response.create(
        model=MODEL,
        input="Hello there.",
        voice="DEFAULT",
        response_format="pcm",
        extra_body={"stream": True},
    ) as response:
        data = b"".join(response.iter_bytes(4096))
    assert len(data) > 0 and len(data) % 2 == 0
    assert np.abs(np.frombuffer(data, dtype="<i2")).max() > 0
    server.wait_idle()


def test_a_seed_gives_the_same_speech_and_another_seed_other_speech(server: PipelineServer):
    client = server.openai()

    def say(seed: int) -> bytes:
        body = {"seed": seed}
        return client.audio.speech.create(
            model=MODEL, input="Hello there.", voice="default", extra_body=body
        ).content

    first, again, other = say(7), say(7), say(8)
    assert first == again and first != other
    with pytest.raises(openai.BadRequestError) as exc:
        say(-1)
    assert exc.value.response.json()["error"]["param"] == "seed"
    server.wait_idle()


def test_bad_input_is_a_400_naming_the_field(server: PipelineServer) -> None:
    client = server.openai()
    for param, kwargs in (
        ("voice", dict(input="hi", voice="alloy")),
        ("input", dict(input="   ", voice="default")),
        ("instructions", dict(input="hi", voice="default", instructions="whisper")),
    ):
        with pytest.raises(openai.BadRequestError) as exc:
            client.audio.speech.create(model=MODEL, **kwargs)
        error = exc.value.response.json()["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error", error
    after = client.audio.speech.create(model=MODEL, input="Still here.", voice="default").content
    assert soundfile.read(io.BytesIO(after))[0].size > 0
    server.wait_idle()
