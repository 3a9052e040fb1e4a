"""Dynin-Omni's speech input on the OpenAI server (the built-in `demo-dynin-omni`): an
`input_audio` part of a chat goes through token2text's S2U encoder into Dynin's s2t prompt;
the answer is token2text's own answer to that prompt (tests/pipeline/
test_dynin_omni_speech_input.py checks the prompt against the reference layout); /v1/models
lists audio input; bad audio is a 400 naming the field."""

from __future__ import annotations

import base64
import io
import wave
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from tests.server.conftest import PipelineServer

MODEL = "demo-dynin-omni"
FIXTURE = Path(__file__).parents[1] / "fixtures/dynin_omni/s2u_reference.npz"


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[PipelineServer]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMNISTAGE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        with PipelineServer(MODEL) as live:
            yield live


def _wav(clip: np.ndarray) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((np.clip(clip, -1, 1) * 32767).astype("<i2").tobytes())
    return buf.getvalue()


def _part(data: bytes) -> dict:
    return {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(data).decode(), "format": "wav"},
    }


def _post(server: PipelineServer, body: dict) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/chat/completions", json={"model": MODEL, **body}, timeout=120
    )


def test_chat_answers_about_an_input_audio_part(server: PipelineServer, tmp_path) -> None:
    from omnistage.families.dynin_omni.tiny import make_tiny_dynin_omni
    from omnistage.families.dynin_omni.token2text import DyninToken2Text
    from omnistage.models.generation import GenerationItem
    from omnistage.multimodal.media import load_audio

    data = _wav(np.load(FIXTURE)["wav_2"])
    question = {"type": "text", "text": "Transcribe the given audio."}
    response = _post(server, {"messages": [{"role": "user", "content": [_part(data), question]}]})
    assert response.status_code == 200, response.text
    model = DyninToken2Text.from_checkpoint(
        make_tiny_dynin_omni(tmp_path / "t"), None, torch.float32
    )
    item = GenerationItem(model.prompt_rows(question["text"], None), meta={"modalities": ["text"]})
    model.take_audios(item, [load_audio(data)])
    (out,) = model.generate([item])
    expected = model.tokenizer.decode(out.tolist(), skip_special_tokens=True)
    assert response.json()["choices"][0]["message"]["content"] == expected
    models = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"]
    assert "audio" in next(m for m in models if m["id"] == MODEL)["input_modalities"]
    server.wait_idle()


def test_bad_audio_is_400_naming_the_field(server: PipelineServer) -> None:
    data = _wav(np.load(FIXTURE)["wav_0"])
    two = {"messages": [{"role": "user", "content": [_part(data), _part(data)]}]}
    response = _post(server, two)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "multi_modal_data", response.text
    garbage = {"messages": [{"role": "user", "content": [_part(b"not a wav file")]}]}
    response = _post(server, garbage)
    assert response.status_code == 400, response.text
    server.wait_idle()
