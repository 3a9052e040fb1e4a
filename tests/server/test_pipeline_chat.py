"""POST /v1/chat/completions over a multi-stage pipeline (demo-omni: thinker -> talker ->
code2wav), with the real server on a loopback port and the real `openai` client: text,
text + audio (whole and streamed), an audio input part, errors, and a disconnect."""

from __future__ import annotations

import base64
import io
import re
import struct
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import soundfile
from PIL import Image

from tests.server.conftest import PipelineServer, record_aborts, record_voices

MODEL = "demo-omni"
HELLO = [{"role": "user", "content": "Say hello."}]


def _error(exc: pytest.ExceptionInfo[openai.APIStatusError]) -> dict[str, Any]:
    return exc.value.response.json()["error"]


def test_text_only_chat(speech_server: PipelineServer) -> None:
    reply = speech_server.openai().chat.completions.create(
        model=MODEL, messages=HELLO, modalities=["text"], max_tokens=8, temperature=0
    )
    choice = reply.choices[0]
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.message.audio is None
    assert choice.finish_reason in ("stop", "length")
    assert reply.usage is not None
    assert 0 < reply.usage.completion_tokens <= 8 and reply.usage.prompt_tokens > 0
    speech_server.wait_idle()


def _audio_request(**kwargs: Any) -> dict[str, Any]:
    return dict(
        model=MODEL,
        messages=HELLO,
        modalities=["text", "audio"],
        audio={"format": "wav", "voice": "ethan"},
        max_tokens=6,
        temperature=0,
        seed=7,
        **kwargs,
    )


def test_text_and_audio_whole_and_streamed(speech_server: PipelineServer) -> None:
    client = speech_server.openai()
    reply = client.chat.completions.create(**_audio_request())
    message = reply.choices[0].message
    assert message.audio is not None and message.audio.id
    assert message.audio.transcript == message.content and message.content
    wav = base64.b64decode(message.audio.data)
    samples, rate = soundfile.read(io.BytesIO(wav), dtype="int16")
    assert rate == 24000 and samples.ndim == 1 and len(samples) > 0
    assert len(wav) == 44 + 2 * len(samples)
    assert struct.unpack("<4sI4s", wav[:12])[::2] == (b"RIFF", b"WAVE")

    texts, audio, ids, finish, usage = [], [], [], None, None
    stream = client.chat.completions.create(
        **_audio_request(), stream=True, stream_options={"include_usage": True}
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content:
                texts.append(delta.content)
            sound = getattr(delta, "audio", None)
            if sound is not None:
                sound = sound if isinstance(sound, dict) else sound.model_dump()
                if sound.get("data"):
                    audio.append(base64.b64decode(sound["data"]))
                if sound.get("id"):
                    ids.append(sound["id"])
            finish = choice.finish_reason or finish
    assert "".join(texts) == message.content  # same seed, greedy: the same reply
    assert len(audio) >= 1 and ids
    assert sum(len(a) for a in audio) == len(wav) - 44  # the same samples, as pcm16
    assert finish in ("stop", "length")
    assert usage is not None and usage.completion_tokens == reply.usage.completion_tokens  # type: ignore[union-attr]
    speech_server.wait_idle()
    metrics = httpx.get(f"{speech_server.url}/metrics").text
    assert 'omnistage_time_to_first_audio_seconds_count{stage="code2wav"}' in metrics


def _sine_wav(seconds: float = 0.5, rate: int = 16000) -> str:
    t = np.arange(int(seconds * rate)) / rate
    buffer = io.BytesIO()
    soundfile.write(buffer, 0.3 * np.sin(2 * np.pi * 440 * t), rate, format="WAV")
    return base64.b64encode(buffer.getvalue()).decode()


def test_audio_input_part(speech_server: PipelineServer) -> None:
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "input_audio", "input_audio": {"data": _sine_wav(), "format": "wav"}},
                {"type": "text", "text": "What do you hear?"},
            ],
        }
    ]
    reply = speech_server.openai().chat.completions.create(
        model=MODEL,
        messages=messages,
        modalities=["text"],
        max_tokens=4,  # type: ignore[arg-type]
    )
    assert reply.choices[0].message.content
    speech_server.wait_idle()


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"modalities": ["audio"]}, "modalities"),
        (
            {"modalities": ["text", "audio"], "audio": {"format": "wav", "voice": "alloy"}},
            "audio.voice",
        ),
        (
            {"modalities": ["text", "audio"], "audio": {"format": "mp3", "voice": "ethan"}},
            "audio.format",
        ),
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"audio": {"format": "wav", "voice": "ethan"}, "modalities": ["text"]}, "audio"),
    ],
)
def test_bad_requests_name_the_field(
    speech_server: PipelineServer, extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        speech_server.openai().chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=2, **extra
        )
    error = _error(exc)
    assert error["param"] == param and param in error["message"]
    if param == "audio.voice":
        assert "not one of aiden, chelsie, ethan" in error["message"]


def test_audio_voice_picks_the_talker_s_speaker(
    speech_server: PipelineServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`audio.voice` is any of the model's speakers, any case, and reaches the pipeline as
    the checkpoint spells it; with the same seed another voice speaks differently."""
    voices = record_voices(speech_server, monkeypatch)
    client = speech_server.openai()
    audio = {}
    for voice in ("ethan", "Chelsie"):
        body = _audio_request()
        body["audio"] = {"format": "wav", "voice": voice}
        reply = client.chat.completions.create(**body)
        audio[voice] = base64.b64decode(reply.choices[0].message.audio.data)
    assert voices == ["ethan", "chelsie"]
    assert audio["ethan"] != audio["Chelsie"]
    speech_server.wait_idle()


def test_bad_parts_and_fields(speech_server: PipelineServer) -> None:
    with httpx.Client(base_url=speech_server.url, timeout=30) as http:
        remote = {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}
        body = {"model": MODEL, "messages": [{"role": "user", "content": [remote]}]}
        answer = http.post("/v1/chat/completions", json=body)
        assert answer.status_code == 400 and "messages[0].content[0]" in answer.text
    speech_server.wait_idle()


def test_stream_disconnect_aborts(
    speech_server: PipelineServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    aborted = record_aborts(speech_server, monkeypatch)
    body = {
        "model": MODEL,
        "messages": HELLO,
        "modalities": ["text", "audio"],
        "audio": {"format": "pcm16", "voice": "ethan"},
        "max_tokens": 2000,
        "ignore_eos": True,
        "stream": True,
    }
    with (
        httpx.Client(base_url=speech_server.url, timeout=60) as http,
        http.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()
        seen = 0
        for line in lines:
            if line.startswith("data: ") and '"content"' in line:
                seen += 1
                if seen >= 3:
                    break  # the thinker is writing: hang up mid-request
    speech_server.wait_idle()
    assert any(rid.startswith("chatcmpl-") for rid in aborted)


def test_media_over_their_bounds_or_not_what_they_say_are_400s_and_the_pipeline_goes_on(
    speech_server: PipelineServer,
) -> None:
    """A 10-minute WAV, a decompression-bomb PNG, WAV bytes declared mp3 (issue 22: the
    first two were 500s, the last was accepted)."""
    buffer = io.BytesIO()
    Image.new("1", (9000, 9000)).save(buffer, format="PNG")
    bomb = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    long_wav = {"data": _silent_wav(601), "format": "wav"}
    parts = [
        ({"type": "input_audio", "input_audio": long_wav}, "601.0 s, over the limit"),
        ({"type": "image_url", "image_url": {"url": bomb}}, "pixels, over the limit"),
        (
            {"type": "input_audio", "input_audio": {"data": _sine_wav(), "format": "mp3"}},
            "declared audio/mp3, but the data is audio/wav",
        ),
        # Their decoders' messages showed "<_io.BytesIO object at 0x7f...>" (issue 22).
        ({"type": "image_url", "image_url": {"url": _corrupt("image/png")}}, "cannot decode"),
        (
            {"type": "input_audio", "input_audio": {"data": _corrupt("wav"), "format": "wav"}},
            "cannot decode",
        ),
    ]
    with httpx.Client(base_url=speech_server.url, timeout=30) as http:
        for part, says in parts:
            content = [part, {"type": "text", "text": "What is this?"}]
            body = {"model": MODEL, "messages": [{"role": "user", "content": content}]}
            answer = http.post("/v1/chat/completions", json=body)
            assert answer.status_code == 400, answer.text
            assert says in answer.json()["error"]["message"]
            assert not re.search("0x[0-9a-f]{6,}|Traceback", answer.text), answer.text
    speech_server.wait_idle()
    test_audio_input_part(speech_server)  # still serving


def _corrupt(kind: str) -> str:
    """A PNG or a WAV whose header is right and whose rest is garbage (passes the type
    check, fails the decoder): a data URL for an image, base64 for audio."""
    if kind == "image/png":
        return "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" * 8).decode()
    return base64.b64encode(b"RIFF\x00\x01\x00\x00WAVE" + b"junk" * 32).decode()


def _silent_wav(seconds: float, rate: int = 8000) -> str:
    buffer = io.BytesIO()
    soundfile.write(buffer, np.zeros(int(seconds * rate), np.int16), rate, format="WAV")
    return base64.b64encode(buffer.getvalue()).decode()
