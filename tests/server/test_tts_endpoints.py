"""POST /v1/audio/speech over a TTS model (the built-in demo-qwen3-tts: talker ->
code2wav), with the real server on a loopback port and the real `openai` client: the
text goes to the talker as it is, with its voice, instructions and language; every
response format decodes; bad input is a 400 naming the field and the server goes on
serving."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import numpy as np
import openai
import pytest
import soundfile

from tests.server.conftest import PipelineServer

MODEL = "demo-qwen3-tts"


@pytest.fixture(scope="module")
def tts_server() -> Iterator[PipelineServer]:
    with PipelineServer(MODEL) as live:
        yield live


def _error(exc: pytest.ExceptionInfo[openai.APIStatusError]) -> dict[str, Any]:
    return exc.value.response.json()["error"]


def _speech(server: PipelineServer, **kwargs: Any) -> bytes:
    return server.openai().audio.speech.create(model=MODEL, **kwargs).content


def test_formats_decode_and_voices_differ(tts_server: PipelineServer) -> None:
    text = "Hello from the tiny talker."
    wav = _speech(tts_server, input=text, voice="Vivian", extra_body={"language": "english"})
    samples, rate = soundfile.read(io.BytesIO(wav), dtype="int16")
    assert rate == 24000 and samples.ndim == 1 and len(samples) > 0
    for fmt in ("flac", "mp3", "opus"):
        data, fmt_rate = soundfile.read(
            io.BytesIO(_speech(tts_server, input=text, voice="ryan", response_format=fmt))
        )
        assert fmt_rate == 24000 and len(data) > 0, fmt
    pcm = _speech(tts_server, input=text, voice="ryan", response_format="pcm")
    other = np.frombuffer(pcm, dtype="<i2")
    assert other.size > 0 and not np.array_equal(other[: samples.size], samples[: other.size])
    styled = _speech(tts_server, input=text, voice="ryan", instructions="Whisper it.")
    assert soundfile.read(io.BytesIO(styled))[0].size > 0
    # speed: the same speech (the same seed: the talker samples) in half the time (the
    # tempo, not the pitch, changes)
    same = dict(input=text, voice="ryan", response_format="pcm", extra_body={"seed": 11})
    normal = np.frombuffer(_speech(tts_server, **same), "<i2")
    fast = _speech(tts_server, **same, speed=2.0)
    assert len(fast) // 2 == round(normal.size / 2)
    tts_server.wait_idle()


def test_streamed_wav_arrives_in_chunks(tts_server: PipelineServer) -> None:
    with tts_server.openai().audio.speech.with_streaming_response.create(
        model=MODEL, input="A streamed sentence.", voice="vivian", extra_body={"stream": True}
    ) as response:
        chunks = list(response.iter_bytes(4096))
    data = b"".join(chunks)
    assert data[:4] == b"RIFF" and len(data) > 44 and (len(data) - 44) % 2 == 0
    tts_server.wait_idle()


def test_bad_input_is_a_400_naming_the_field(tts_server: PipelineServer) -> None:
    client = tts_server.openai()
    cases = {
        "voice": dict(input="hi", voice="alloy"),
        "language": dict(input="hi", voice="ryan", extra_body={"language": "klingon"}),
        "input": dict(input="   ", voice="ryan"),
        "response_format": dict(input="hi", voice="ryan", response_format="aac"),
        "speed": dict(input="hi", voice="ryan", speed=0.1),
    }
    for param, kwargs in cases.items():
        with pytest.raises(openai.BadRequestError) as exc:
            client.audio.speech.create(model=MODEL, **kwargs)
        assert _error(exc)["param"] == param, (param, _error(exc))
    # The server still serves, and nothing is left behind.
    assert len(_speech(tts_server, input="Still here.", voice="vivian")) > 44
    tts_server.wait_idle()


# -- uploaded voices (a Base checkpoint clones them) ----------------------------------------
@pytest.fixture(scope="module")
def base_server(tmp_path_factory) -> Iterator[PipelineServer]:
    from omnistage.families.qwen3_tts.tiny import make_tiny_qwen3_tts

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMNISTAGE_CACHE_DIR", str(tmp_path_factory.mktemp("voices-cache")))
        ckpt = make_tiny_qwen3_tts(tmp_path_factory.mktemp("tts-base") / "base", 0, "base")
        with PipelineServer(str(ckpt)) as live:
            yield live


def _wav(seconds: float, amplitude: float = 0.3) -> str:
    import base64

    t = np.arange(int(24000 * seconds)) / 24000
    buffer = io.BytesIO()
    soundfile.write(buffer, amplitude * np.sin(2 * np.pi * 180 * t), 24000, format="WAV")
    return base64.b64encode(buffer.getvalue()).decode()


def test_voices_upload_list_speak_delete(base_server: PipelineServer) -> None:
    import httpx

    with httpx.Client(base_url=base_server.url, timeout=60) as http:
        created = http.post("/v1/audio/voices", json={"audio": _wav(2), "text": "A hum."})
        assert created.status_code == 201, created.text
        voice = created.json()
        assert voice["object"] == "voice" and voice["id"].startswith("voice-")
        assert voice["seconds"] == 2.0 and voice["text"] == "A hum."
        import base64

        form = http.post(
            "/v1/audio/voices",
            files={"audio": ("me.wav", base64.b64decode(_wav(1.5)), "audio/wav")},
            data={"text": "Another hum.", "name": "form upload"},
        )
        assert form.status_code == 201, form.text
        assert form.json()["name"] == "form upload" and form.json()["seconds"] == 1.5
        listed = http.get("/v1/audio/voices").json()["data"]
        assert [v["id"] for v in listed] == [voice["id"], form.json()["id"]]
        assert http.delete(f"/v1/audio/voices/{form.json()['id']}").status_code == 200
        missing = http.post("/v1/audio/voices", files={"other": ("x.wav", b"x")})
        assert missing.status_code == 400 and missing.json()["error"]["param"] == "audio"
        speech = http.post(
            "/v1/audio/speech",
            json={"model": base_server.name, "input": "Hi.", "voice": voice["id"]},
        )
        assert speech.status_code == 200 and len(speech.content) > 44, speech.text
        bad = {
            "audio": {"audio": _wav(0.2)},
            "text": {"audio": _wav(2), "text": "x" * 5000},
        }
        for param, body in bad.items():
            answer = http.post("/v1/audio/voices", json=body)
            assert answer.status_code == 400 and answer.json()["error"]["param"] == param
        silent = http.post("/v1/audio/voices", json={"audio": _wav(2, amplitude=0.0)})
        assert silent.status_code == 400 and "silent" in silent.json()["error"]["message"]
        assert http.delete(f"/v1/audio/voices/{voice['id']}").json()["deleted"] is True
        assert http.delete(f"/v1/audio/voices/{voice['id']}").status_code == 404
        gone = http.post(
            "/v1/audio/speech",
            json={"model": base_server.name, "input": "Hi.", "voice": voice["id"]},
        )
        assert gone.status_code == 400 and gone.json()["error"]["param"] == "voice"
        assert http.get("/v1/audio/voices").json()["data"] == []
    base_server.wait_idle()
