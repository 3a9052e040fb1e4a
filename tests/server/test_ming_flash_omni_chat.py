"""POST /v1/chat/completions and /v1/audio/speech over Ming-flash-omni-2.0 (the built-in
demo-ming-flash-omni: thinker -> talker -> audio VAE) with the real server and the real
`openai` client: a text answer whole and streamed to the same text; audio out, whole
(a WAV at the VAE's rate whose transcript is the text) and streamed (the same samples as
PCM); `/v1/audio/speech` speaks (as every omni pipeline's, the thinker's reply to the
input); bad input is a 400 in the OpenAI error shape naming the field, and the server
goes on serving."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import numpy as np
import openai
import pytest
import soundfile

from tests.server.conftest import PipelineServer

MODEL = "demo-ming-flash-omni"
HELLO = [{"role": "user", "content": "Hello"}]
RATE = 16000  # the tiny audio VAE's sample rate


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


def test_chat_with_audio_out_whole_and_streamed(server: PipelineServer) -> None:
    client = server.openai()
    ask = dict(model=MODEL, messages=HELLO, max_tokens=6, temperature=0, seed=3)
    ask.update(modalities=["text", "audio"], audio={"format": "wav", "voice": "default"})
    message = client.chat.completions.create(**ask).choices[0].message
    samples, rate = soundfile.read(io.BytesIO(base64.b64decode(message.audio.data)), dtype="int16")
    assert rate == RATE and samples.size > 0
    assert message.audio.transcript == message.content
    pieces, texts = [], []
    for chunk in client.chat.completions.create(**ask, stream=True):
        for choice in chunk.choices:
            texts.append(choice.delta.content or "")
            sound = getattr(choice.delta, "audio", None)
            sound = sound if sound is None or isinstance(sound, dict) else sound.model_dump()
            if sound and sound.get("data"):
                pieces.append(base64.b64decode(sound["data"]))
    assert "".join(texts) == message.content
    np.testing.assert_array_equal(np.frombuffer(b"".join(pieces), dtype="<i2"), samples)
    server.wait_idle()


def test_speech_and_bad_input_are_400s_naming_the_field(server: PipelineServer) -> None:
    client = server.openai()
    wav = client.audio.speech.create(model=MODEL, input="Hello there.", voice="default").content
    samples, rate = soundfile.read(io.BytesIO(wav))
    assert rate == RATE and samples.size > 0
    for param, kwargs in {
        "messages": dict(messages=[]),
        "max_tokens": dict(messages=HELLO, max_tokens=-1),
        "modalities": dict(messages=HELLO, modalities=["image"]),
    }.items():
        with pytest.raises(openai.BadRequestError) as exc:
            client.chat.completions.create(model=MODEL, **kwargs)
        error = exc.value.response.json()["error"]
        assert error["param"] == param, error
        assert error["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as exc:
        client.audio.speech.create(model=MODEL, input="  ", voice="default")
    assert exc.value.response.json()["error"]["param"] == "input"
    after = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=3)
    assert after.choices[0].message.content is not None
    server.wait_idle()
