"""Covo-Audio served (the built-in demo-covo-audio: fused thinker+talker -> code2wav) with the
real server and the real `openai` client: chat completions with text and audio out, whole
and streamed (the same samples), with audio in (an image is a 400), `/v1/audio/speech`, and bad input as a 400 in the OpenAI
error shape naming the field, after which the server goes on serving."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import numpy as np
import openai
import pytest
import soundfile

from omnistage.families.covo_audio.audio_input import audio_token_count
from tests.server.conftest import PipelineServer

MODEL = "demo-covo-audio"
HELLO = [{"role": "user", "content": "Tell me a story."}]


@pytest.fixture(scope="module")
def server() -> Iterator[PipelineServer]:
    with PipelineServer(MODEL) as live:
        yield live


def _chat(**extra):
    body = dict(
        model=MODEL, messages=HELLO, max_tokens=24, temperature=0.0,
        modalities=["text", "audio"], audio={"format": "wav", "voice": "default"},
    )  # fmt: skip
    return {**body, **extra}


def test_chat_with_audio_out_whole_and_streamed(server: PipelineServer) -> None:
    client = server.openai()
    message = client.chat.completions.create(**_chat()).choices[0].message
    assert message.audio is not None and message.content is not None
    wav = base64.b64decode(message.audio.data)
    samples, rate = soundfile.read(io.BytesIO(wav), dtype="int16")
    assert rate == 24000 and samples.ndim == 1 and len(samples) > 0
    texts, audio = [], []
    for chunk in client.chat.completions.create(**_chat(), stream=True):
        for choice in chunk.choices:
            texts.append(choice.delta.content or "")
            sound = getattr(choice.delta, "audio", None)
            sound = sound if isinstance(sound, dict) or sound is None else sound.model_dump()
            if sound and sound.get("data"):
                audio.append(base64.b64decode(sound["data"]))
    assert "".join(texts) == message.content
    streamed = np.frombuffer(b"".join(audio), dtype="<i2")
    # The same samples: streamed pcm16 chunks are converted as soundfile writes the whole wav.
    np.testing.assert_array_equal(streamed, samples)
    server.wait_idle()


def test_chat_with_audio_in(server: PipelineServer) -> None:
    t = np.arange(8000) / 16000
    buffer = io.BytesIO()
    soundfile.write(buffer, 0.3 * np.sin(2 * np.pi * 440 * t), 16000, format="WAV")
    part = {
        "type": "input_audio",
        "input_audio": {"format": "wav", "data": base64.b64encode(buffer.getvalue()).decode()},
    }
    messages = [{"role": "user", "content": [part, {"type": "text", "text": "Answer."}]}]
    reply = server.openai().chat.completions.create(**_chat(messages=messages))
    assert reply.choices[0].message.audio is not None
    text_only = [{"role": "user", "content": "Answer."}]
    plain = server.openai().chat.completions.create(**_chat(messages=text_only, max_tokens=1))
    # The clip counts as the thinker takes it: its placeholder's start and end markers and
    # one position per audio token (the stage expands the pad marker).
    expanded = 2 + audio_token_count(len(t))
    assert reply.usage.prompt_tokens == plain.usage.prompt_tokens + expanded
    stream = server.openai().chat.completions.create(
        **_chat(messages=messages), stream=True, stream_options={"include_usage": True}
    )
    assert [c.usage.prompt_tokens for c in stream if c.usage] == [reply.usage.prompt_tokens]
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with pytest.raises(openai.BadRequestError) as exc:
        server.openai().chat.completions.create(
            **_chat(messages=[{"role": "user", "content": [image]}])
        )
    assert "image" in exc.value.response.json()["error"]["message"]
    server.wait_idle()


def test_speech_and_its_bad_input(server: PipelineServer) -> None:
    client = server.openai()
    speech = client.audio.speech.create(model=MODEL, input="Hello there.", voice="default")
    samples, rate = soundfile.read(io.BytesIO(speech.content), dtype="int16")
    assert rate == 24000 and samples.size > 0
    for param, kwargs in {
        "input": dict(input=""),
        "response_format": dict(input="hi", response_format="aac"),
        "instructions": dict(input="hi", instructions="slowly"),
    }.items():
        with pytest.raises(openai.BadRequestError) as exc:
            client.audio.speech.create(model=MODEL, voice="default", **kwargs)
        error = exc.value.response.json()["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error", error
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(**_chat(max_tokens=-1))
    assert exc.value.response.json()["error"]["param"] == "max_tokens"
    after = client.audio.speech.create(model=MODEL, input="Still here.", voice="default")
    assert soundfile.read(io.BytesIO(after.content))[0].size > 0
    server.wait_idle()
