"""POST /v1/chat/completions over Ming-Omni (the built-in demo-ming-omni: thinker -> talker
-> vocoder) with the real server and the real `openai` client: a text answer, whole and
streamed; text and audio, whole and streamed (the same samples, up to the two pcm16 conversions); an image and an audio
clip in (answers that depend on them); bad input (an unknown voice among it) is a 400 in the OpenAI error shape naming the field, and the server goes
on serving."""

from __future__ import annotations

import base64
import io
import wave
from collections.abc import Iterator

import numpy as np
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
        "modalities": dict(messages=HELLO, modalities=["audio"]),
        "audio.voice": dict(
            messages=HELLO, modalities=["text", "audio"], audio={"format": "wav", "voice": "x"}
        ),
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


def test_text_and_audio_whole_and_streamed(server: PipelineServer) -> None:
    client = server.openai()
    body = dict(
        model=MODEL,
        messages=HELLO,
        max_tokens=6,
        temperature=0,
        modalities=["text", "audio"],
        audio={"format": "wav", "voice": "luna"},
        seed=3,
    )
    reply = client.chat.completions.create(**body)
    message = reply.choices[0].message
    assert message.audio is not None and message.audio.transcript == message.content
    with wave.open(io.BytesIO(base64.b64decode(message.audio.data))) as wav:
        assert wav.getframerate() == 22050 and wav.getnframes() > 0
        pcm = wav.readframes(wav.getnframes())
    streamed = b""
    for chunk in client.chat.completions.create(**body, stream=True):
        sound = getattr(chunk.choices[0].delta, "audio", None) if chunk.choices else None
        sound = sound if sound is None or isinstance(sound, dict) else sound.model_dump()
        if sound and sound.get("data"):
            streamed += base64.b64decode(sound["data"])
    # The same samples: the stream's pcm16 deltas are converted as soundfile writes the wav.
    whole_pcm = np.frombuffer(pcm, np.int16).astype(np.int32)
    streamed_pcm = np.frombuffer(streamed, np.int16).astype(np.int32)
    np.testing.assert_array_equal(streamed_pcm, whole_pcm)
    assert np.abs(whole_pcm).max() > 100  # not silence
    server.wait_idle()


def _image_turn(image: np.ndarray) -> list[dict]:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    content = [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "What is in it?"},
    ]
    return [{"role": "user", "content": content}]


def test_image_input_answers_text_that_depends_on_it(server: PipelineServer) -> None:
    """An `image_url` part goes through Ming's image processor, ViT, projector and image
    routing (tests/models/test_ming_omni_image.py checks those against the reference)."""
    client = server.openai()
    rng = np.random.default_rng(0)
    first, second = (rng.integers(0, 256, (60, 90, 3), dtype=np.uint8) for _ in range(2))
    answers = [
        client.chat.completions.create(
            model=MODEL,
            messages=_image_turn(image),
            max_tokens=8,
            temperature=0,
            modalities=["text"],
        )
        .choices[0]
        .message.content
        for image in (first, first, second)
    ]
    assert answers[0] and answers[0] == answers[1] and answers[0] != answers[2]
    server.wait_idle()


def _audio_turn(samples: np.ndarray) -> list[dict]:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    data = base64.b64encode(buffer.getvalue()).decode()
    content = [
        {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}},
        {"type": "text", "text": "What is said?"},
    ]
    return [{"role": "user", "content": content}]


def test_audio_input_answers_text_that_depends_on_it(server: PipelineServer) -> None:
    """An `input_audio` part goes through Ming's fbank, SANM encoder, projector and audio
    routing (tests/models/test_ming_omni_audio.py checks those against the reference); a
    broken clip is a 400 naming the audio."""
    client = server.openai()
    rng = np.random.default_rng(1)
    first, second = (0.3 * rng.standard_normal(12000) for _ in range(2))
    answers = [
        client.chat.completions.create(
            model=MODEL,
            messages=_audio_turn(clip),
            max_tokens=8,
            temperature=0,
            modalities=["text"],
        )
        .choices[0]
        .message.content
        for clip in (first, first, second)
    ]
    assert answers[0] and answers[0] == answers[1] and answers[0] != answers[2]
    with pytest.raises(openai.BadRequestError) as exc:
        audio = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": [audio]}], modalities=["text"]
        )
    assert "audio" in exc.value.response.json()["error"]["message"]
    server.wait_idle()
