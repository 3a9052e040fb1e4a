"""MiMo-Audio (the built-in demo-mimo-audio: fused LM -> code2wav) behind the real server
with the real `openai` client: chat completions with text and audio out, whole and
streamed, and `/v1/audio/speech`, chat with an `input_audio` clip; bad input is a 400 in the OpenAI error shape naming
the field, and the server goes on serving."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest
import soundfile

from tests.server.conftest import PipelineServer

MODEL = "demo-mimo-audio"
HELLO = [{"role": "user", "content": "Hello there."}]


@pytest.fixture(scope="module")
def server() -> Iterator[PipelineServer]:
    with PipelineServer(MODEL) as live:
        yield live


def test_chat_with_audio_out(server: PipelineServer) -> None:
    client = server.openai()
    reply = client.chat.completions.create(
        model=MODEL,
        messages=HELLO,
        modalities=["text", "audio"],
        audio={"format": "wav", "voice": "default"},
        max_tokens=12,
        temperature=0,
    )
    message = reply.choices[0].message
    samples, rate = soundfile.read(io.BytesIO(base64.b64decode(message.audio.data)))
    assert rate == 24000 and samples.size > 0 and samples.size % 64 == 0  # whole groups
    assert message.audio.transcript == message.content
    assert "<|empty|>" not in (message.content or "")
    streamed = client.chat.completions.create(
        model=MODEL,
        messages=HELLO,
        modalities=["text", "audio"],
        audio={"format": "wav", "voice": "default"},
        max_tokens=12,
        temperature=0,
        stream=True,
    )
    texts, pieces = [], []
    for chunk in streamed:
        for choice in chunk.choices:
            texts.append(choice.delta.content or "")
            sound = getattr(choice.delta, "audio", None)
            sound = sound if sound is None or isinstance(sound, dict) else sound.model_dump()
            if sound and sound.get("data"):
                pieces.append(base64.b64decode(sound["data"]))
    pcm = b"".join(pieces)
    assert "".join(texts) == message.content
    assert len(pcm) == 2 * samples.size
    server.wait_idle()


def test_speech_and_bad_input_is_a_400_naming_the_field(server: PipelineServer) -> None:
    client = server.openai()
    audio = client.audio.speech.create(model=MODEL, input="Hello.", voice="default").content
    samples, rate = soundfile.read(io.BytesIO(audio))
    assert rate == 24000 and samples.size > 0
    for param, kwargs in {
        "voice": dict(input="hi", voice="alloy"),
        "input": dict(input="   ", voice="default"),
        "instructions": dict(input="hi", voice="default", instructions="softly"),
        "response_format": dict(input="hi", voice="default", response_format="aac"),
    }.items():
        with pytest.raises(openai.BadRequestError) as exc:
            client.audio.speech.create(model=MODEL, **kwargs)
        error = exc.value.response.json()["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error"
    after = client.audio.speech.create(model=MODEL, input="Still here.", voice="default").content
    assert soundfile.read(io.BytesIO(after))[0].size > 0
    server.wait_idle()


def _wav(seconds: float, rate: int = 16000) -> str:
    t = np.arange(int(seconds * rate)) / rate
    buffer = io.BytesIO()
    soundfile.write(buffer, 0.3 * np.sin(2 * np.pi * 440 * t), rate, format="WAV")
    return base64.b64encode(buffer.getvalue()).decode()


def test_chat_with_audio_in_and_bad_audio_is_a_400(server: PipelineServer) -> None:
    client = server.openai()
    part = {"type": "input_audio", "input_audio": {"format": "wav", "data": _wav(0.1)}}
    messages = [{"role": "user", "content": [part, {"type": "text", "text": "Answer."}]}]
    kwargs = dict(model=MODEL, modalities=["text", "audio"], max_tokens=6, temperature=0)
    reply = client.chat.completions.create(messages=messages, **kwargs)
    assert reply.choices[0].message.audio is not None
    assert reply.usage.completion_tokens == 6
    bad = [
        ({"format": "mp3", "data": _wav(0.1)}, "declared audio/mp3, but the data is audio/wav"),
        ({"format": "wav", "data": "bm90IGEgd2F2"}, "input_audio.format: declared audio/wav"),
        ({"format": "wav", "data": _wav(0.0001)}, "too short"),
    ]
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for audio, says in bad:
            content = [{"type": "input_audio", "input_audio": audio}]
            body = {"model": MODEL, "messages": [{"role": "user", "content": content}]}
            response = http.post("/v1/chat/completions", json=body)
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert says in error["message"] and error["type"] == "invalid_request_error", error
    after = client.chat.completions.create(messages=HELLO, **kwargs)
    assert after.choices[0].message.audio is not None
    server.wait_idle()
