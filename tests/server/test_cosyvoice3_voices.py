"""/v1/audio/voices over CosyVoice3 (the tiny demo checkpoint with its speech tokenizer
and CAM++) with the real server: an uploaded clip is cloned and spoken in, whole and
streamed; the voice survives a restart (a second server on the same cache directory),
and that server, scheduling synchronously, answers the same request with the same bytes
as the first, scheduling asynchronously; bad uploads are a 400 naming the field."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.pipeline_client import PipelineClient
from omnistage.families.cosyvoice3.tiny import make_tiny_cosyvoice3
from omnistage.testing.tiny_deploys import tiny_speech_deploy
from tests.server.conftest import _ThreadedServer


class _SpecServer(_ThreadedServer):
    def __init__(self, checkpoint: Path, async_scheduling: bool) -> None:
        spec = tiny_speech_deploy(
            "demo-cosyvoice3", checkpoint, dtype="float32", async_scheduling=async_scheduling
        )
        client = PipelineClient(spec, in_process=True)
        self.name = str(checkpoint)
        super().__init__(build_app(client, [self.name], model_path=self.name), client)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Iterator[Path]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMNISTAGE_CACHE_DIR", str(tmp_path_factory.mktemp("voices-cache")))
        yield make_tiny_cosyvoice3(tmp_path_factory.mktemp("cosyvoice3") / "tiny")


def _wav(seconds: float, amplitude: float = 0.3, rate: int = 24000) -> bytes:
    t = np.arange(int(rate * seconds)) / rate
    hum = amplitude * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 2 * t))
    buffer = io.BytesIO()
    soundfile.write(buffer, hum, rate, format="WAV")
    return buffer.getvalue()


def _speak(http: httpx.Client, model: str, voice: str, **extra: object) -> httpx.Response:
    body = {"model": model, "input": "Hi", "voice": voice, **extra}
    return http.post("/v1/audio/speech", json=body)


def test_upload_speak_restart_delete(checkpoint: Path) -> None:
    with (
        _SpecServer(checkpoint, True) as server,
        httpx.Client(base_url=server.url, timeout=120) as http,
    ):
        created = http.post(
            "/v1/audio/voices",
            json={"audio": base64.b64encode(_wav(2)).decode(), "text": "A hum."},
        )
        assert created.status_code == 201, created.text
        voice = created.json()
        assert voice["id"].startswith("voice-") and voice["text"] == "A hum."
        form = http.post(
            "/v1/audio/voices",
            files={"audio": ("me.wav", _wav(1.5, rate=16000), "audio/wav")},
            data={"name": "no transcript"},
        )
        assert form.status_code == 201, form.text
        listed = [v["id"] for v in http.get("/v1/audio/voices").json()["data"]]
        assert listed == [voice["id"], form.json()["id"]]
        whole = _speak(http, server.name, voice["id"])
        assert whole.status_code == 200, whole.text
        samples, rate = soundfile.read(io.BytesIO(whole.content), dtype="int16")
        assert rate == 24000 and samples.size > 0
        demo = soundfile.read(io.BytesIO(_speak(http, server.name, "demo").content))[0]
        assert demo.size != samples.size or not np.array_equal(demo, samples)
        streamed = _speak(http, server.name, voice["id"], stream=True, response_format="pcm")
        assert streamed.status_code == 200 and len(streamed.content) > 0
        assert _speak(http, server.name, form.json()["id"]).status_code == 200
        for param, body in {
            "audio": {"audio": base64.b64encode(_wav(0.3)).decode()},
            "text": {"audio": base64.b64encode(_wav(2)).decode(), "text": "x" * 5000},
        }.items():
            answer = http.post("/v1/audio/voices", json=body)
            assert answer.status_code == 400 and answer.json()["error"]["param"] == param
    with (
        _SpecServer(checkpoint, False) as server,
        httpx.Client(base_url=server.url, timeout=120) as http,
    ):
        listed = [v["id"] for v in http.get("/v1/audio/voices").json()["data"]]
        assert listed == [voice["id"], form.json()["id"]]
        again = _speak(http, server.name, voice["id"])
        assert again.status_code == 200 and again.content == whole.content
        assert http.delete(f"/v1/audio/voices/{voice['id']}").json()["deleted"] is True
        gone = _speak(http, server.name, voice["id"])
        assert gone.status_code == 400 and gone.json()["error"]["param"] == "voice"
        assert [v["id"] for v in http.get("/v1/audio/voices").json()["data"]] == [form.json()["id"]]
