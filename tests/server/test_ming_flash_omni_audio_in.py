"""Ming-flash-omni-2.0 audio input behind the OpenAI server (the built-in
demo-ming-flash-omni, the real server and client): chat completions with an `input_audio`
part answer text that depends on the clip (greedy: the same clip the same answer, another
clip another); bad audio is a 400 in the OpenAI error shape naming the problem, and the
server goes on serving."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import soundfile

from tests.server.conftest import PipelineServer

MODEL = "demo-ming-flash-omni"
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def server() -> Iterator[PipelineServer]:
    with PipelineServer(MODEL) as live:
        yield live


def _wav(seconds: float, hz: float = 440.0, rate: int = 16000) -> str:
    t = np.arange(int(seconds * rate)) / rate
    buffer = io.BytesIO()
    soundfile.write(buffer, 0.3 * np.sin(2 * np.pi * hz * t), rate, format="WAV")
    return base64.b64encode(buffer.getvalue()).decode()


def _body(audio: dict) -> dict:
    content = [{"type": "input_audio", "input_audio": audio}, {"type": "text", "text": "What?"}]
    messages = [{"role": "user", "content": content}]
    return {"model": MODEL, "messages": messages, "max_tokens": 6, "temperature": 0}


def test_chat_with_audio_answers_text_that_depends_on_it(server: PipelineServer) -> None:
    clips = [_wav(0.3), _wav(0.3), _wav(0.3, 2500), _wav(0.5, 300, rate=24000)]
    with httpx.Client(base_url=server.url, timeout=120) as http:
        replies = [http.post(CHAT, json=_body({"format": "wav", "data": c})) for c in clips]
    for reply in replies:
        assert reply.status_code == 200, reply.text
    answers = [r.json()["choices"][0]["message"]["content"] for r in replies]
    assert answers[0] == answers[1] and answers[0] != answers[2]  # greedy: the clip decides
    assert answers[3]
    server.wait_idle()


def test_bad_audio_is_a_400_naming_it(server: PipelineServer) -> None:
    bad = [
        ({"format": "wav", "data": "bm90IGEgd2F2"}, "input_audio.format: declared audio/wav"),
        ({"format": "wav", "data": _wav(5.0)}, "longer than the encoder's 4.0 s"),
    ]
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for audio, says in bad:
            reply = http.post(CHAT, json=_body(audio))
            assert reply.status_code == 400, reply.text
            error = reply.json()["error"]
            assert says in error["message"] and error["type"] == "invalid_request_error", error
        ok = http.post(CHAT, json=_body({"format": "wav", "data": _wav(0.2)}))
        assert ok.status_code == 200, ok.text
    server.wait_idle()
