"""The OpenAI server over multi-stage pipelines: /v1/images/generations (demo-image) and
/v1/audio/speech (demo-omni), with the real server on a loopback port and the real
`openai` client. Stages run in the server process (`in_process=True`) for speed; the
demo-omni server (`speech_server`) is conftest's, shared with test_pipeline_chat."""

from __future__ import annotations

import base64
import io
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import soundfile
from PIL import Image

from tests.server.conftest import PipelineServer, record_aborts, record_voices


@pytest.fixture(scope="module")
def image_server() -> Iterator[PipelineServer]:
    with PipelineServer("demo-image") as live:
        yield live


def _error(exc: pytest.ExceptionInfo[openai.APIStatusError]) -> dict[str, Any]:
    return exc.value.response.json()["error"]


# -- images -----------------------------------------------------------------------------------
def test_image_generation_decodes_to_png(image_server: PipelineServer) -> None:
    client = image_server.openai()
    result = client.images.generate(
        model="demo-image",
        prompt="a red fox in the snow",
        size="64x64",
        response_format="b64_json",
        n=2,
        extra_body={"seed": 3, "num_inference_steps": 2},
    )
    assert len(result.data) == 2
    arrays = []
    for item in result.data:
        image = Image.open(io.BytesIO(base64.b64decode(item.b64_json)))
        assert image.format == "PNG" and image.size == (64, 64)
        arrays.append(np.asarray(image))
        assert isinstance(item.revised_prompt, str) and item.revised_prompt
    assert not np.array_equal(arrays[0], arrays[1])  # seeds 3 and 4
    again = client.images.generate(
        model="demo-image",
        prompt="a red fox in the snow",
        size="64x64",
        extra_body={"seed": 3, "num_inference_steps": 2},
    )
    image = np.asarray(Image.open(io.BytesIO(base64.b64decode(again.data[0].b64_json))))
    assert np.array_equal(image, arrays[0])
    image_server.wait_idle()


@pytest.mark.parametrize("size", ["65x64", "64", "0x64", "100000x64"])
def test_image_bad_size_is_400_naming_size(image_server: PipelineServer, size: str) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        image_server.openai().images.generate(model="demo-image", prompt="x", size=size)  # type: ignore[arg-type]
    error = _error(exc)
    assert error["param"] == "size" and "size" in error["message"]


def test_image_errors(image_server: PipelineServer) -> None:
    client = image_server.openai()
    with pytest.raises(openai.BadRequestError) as exc:
        client.images.generate(model="demo-image", prompt="x", response_format="url")
    assert _error(exc)["param"] == "response_format"
    with pytest.raises(openai.NotFoundError):
        client.images.generate(model="nope", prompt="x")
    with pytest.raises(openai.BadRequestError) as exc:
        client.images.generate(model="demo-image", prompt="x", extra_body={"steps": 2})
    assert "steps" in _error(exc)["message"]
    # what the pipeline cannot produce: no speech route; chat answers its thinker's text,
    # and audio out is a 400 naming modalities
    with httpx.Client(base_url=image_server.url, timeout=30) as http:
        speech = {"model": "demo-image", "input": "hi", "voice": "ethan"}
        assert http.post("/v1/audio/speech", json=speech).status_code == 404
        chat = {"model": "demo-image", "messages": [{"role": "user", "content": "hi"}]}
        answer = http.post("/v1/chat/completions", json={**chat, "max_tokens": 4})
        assert answer.status_code == 200
        assert isinstance(answer.json()["choices"][0]["message"]["content"], str)
        prompt = {"model": "demo-image", "prompt": "hi", "max_tokens": 2}
        answer = http.post("/v1/completions", json=prompt)  # the thinker's text, raw prompt
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] <= 2
        answer = http.post("/v1/chat/completions", json={**chat, "modalities": ["text", "audio"]})
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "modalities"
        assert http.get("/health").status_code == 200
        assert [m["id"] for m in http.get("/v1/models").json()["data"]] == ["demo-image"]


# -- speech -----------------------------------------------------------------------------------
def _speech(server: PipelineServer, response_format: str, stream: bool = False) -> bytes:
    client = server.openai()
    kwargs: dict[str, Any] = dict(
        model="demo-omni", input="Hello there.", voice="ethan", response_format=response_format
    )
    if not stream:
        return client.audio.speech.create(**kwargs).content
    with client.audio.speech.with_streaming_response.create(
        **kwargs, extra_body={"stream": True}
    ) as response:
        assert response.status_code == 200
        return b"".join(response.iter_bytes())


def test_speech_formats_decode(speech_server: PipelineServer) -> None:
    jobs = [("wav", False), ("pcm", False), ("flac", False), ("wav", True), ("pcm", True)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        wav, pcm, flac, wav_stream, pcm_stream = pool.map(
            lambda job: _speech(speech_server, *job), jobs
        )
    samples, rate = soundfile.read(io.BytesIO(wav), dtype="int16")
    assert rate == 24000 and samples.ndim == 1 and len(samples) > 0
    assert len(wav) == 44 + 2 * len(samples)  # the header's length is the data's
    assert len(pcm) % 2 == 0 and len(pcm) > 0
    flac_samples, flac_rate = soundfile.read(io.BytesIO(flac), dtype="int16")
    assert flac_rate == 24000 and len(flac_samples) > 0
    # streamed: a WAV header of unknown length, then 16-bit samples
    riff, _, wave, _, _, fmt, channels, stream_rate, _, _, bits, data, size = struct.unpack(
        "<4sI4s4sIHHIIHH4sI", wav_stream[:44]
    )
    assert (riff, wave, data, fmt, channels, stream_rate, bits) == (
        b"RIFF",
        b"WAVE",
        b"data",
        1,
        1,
        24000,
        16,
    )
    assert size == 0xFFFFFFFF and len(wav_stream) > 44 and (len(wav_stream) - 44) % 2 == 0
    assert len(pcm_stream) > 0 and len(pcm_stream) % 2 == 0
    speech_server.wait_idle()
    metrics = httpx.get(f"{speech_server.url}/metrics").text
    assert 'omnistage_time_to_first_audio_seconds_count{stage="code2wav"}' in metrics


def test_speech_with_another_voice(
    speech_server: PipelineServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`voice` may be any of the model's speakers (any case); the pipeline speaks with it."""
    voices = record_voices(speech_server, monkeypatch)
    wav = (
        speech_server.openai()
        .audio.speech.create(model="demo-omni", input="Hello there.", voice="AIDEN")
        .content
    )
    samples, rate = soundfile.read(io.BytesIO(wav), dtype="int16")
    assert rate == 24000 and len(samples) > 0
    assert voices == ["aiden"]
    speech_server.wait_idle()


def test_speech_errors(speech_server: PipelineServer) -> None:
    client = speech_server.openai()
    with pytest.raises(openai.BadRequestError) as exc:
        client.audio.speech.create(model="demo-omni", input="hi", voice="alloy")
    assert _error(exc)["param"] == "voice"
    assert "not one of aiden, chelsie, ethan" in _error(exc)["message"]
    with pytest.raises(openai.BadRequestError) as exc:
        client.audio.speech.create(
            model="demo-omni", input="hi", voice="ethan", response_format="aac"
        )
    assert _error(exc)["param"] == "response_format"
    with pytest.raises(openai.BadRequestError) as exc:
        client.audio.speech.create(model="demo-omni", input="", voice="ethan")
    assert _error(exc)["param"] == "input"
    with pytest.raises(openai.NotFoundError):
        client.audio.speech.create(model="nope", input="hi", voice="ethan")
    with httpx.Client(base_url=speech_server.url, timeout=30) as http:
        body = {"model": "demo-omni", "prompt": "hi"}
        assert http.post("/v1/images/generations", json=body).status_code == 404


def test_speech_stream_disconnect_aborts(
    speech_server: PipelineServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    aborted = record_aborts(speech_server, monkeypatch)
    body = {"model": "demo-omni", "input": "Hello there.", "response_format": "pcm", "stream": True}
    with (
        httpx.Client(base_url=speech_server.url, timeout=60) as http,
        http.stream("POST", "/v1/audio/speech", json=body) as response,
    ):
        assert response.status_code == 200  # the stream started: hang up mid-request
    speech_server.wait_idle()  # nothing left in any stage
    # A warm demo-omni may finish the whole (short) reply before the hang-up is seen; when
    # it did not, the request was aborted rather than left running.
    assert all(rid.startswith("speech-") for rid in aborted)
