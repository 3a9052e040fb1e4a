"""Ming-flash-omni-2.0 image input behind the OpenAI server (the built-in
demo-ming-flash-omni, the real server and client): chat completions with `image_url`
parts answer text that depends on the image (greedy: the same image the same answer,
another image another); a corrupt image is a 400 naming the problem, and the server goes
on serving."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.server.conftest import PipelineServer

MODEL = "demo-ming-flash-omni"
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def server() -> Iterator[PipelineServer]:
    with PipelineServer(MODEL) as live:
        yield live


def _png(array: np.ndarray) -> str:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _body(*urls: str) -> dict:
    content = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    content.append({"type": "text", "text": "What is in it?"})
    messages = [{"role": "user", "content": content}]
    return {"model": MODEL, "messages": messages, "max_tokens": 6, "temperature": 0}


def test_chat_with_images_answers_text_that_depends_on_them(server: PipelineServer) -> None:
    rng = np.random.RandomState(0)
    small, other = (rng.randint(0, 256, (64, 64, 3)).astype(np.uint8) for _ in range(2))
    wide = rng.randint(0, 256, (64, 128, 3)).astype(np.uint8)
    with httpx.Client(base_url=server.url, timeout=120) as http:
        replies = [http.post(CHAT, json=_body(_png(x))) for x in (small, small, other, wide)]
        text = http.post(CHAT, json=_body()).json()
    for reply in replies:
        assert reply.status_code == 200, reply.text
    bodies = [r.json() for r in replies]
    answers = [b["choices"][0]["message"]["content"] for b in bodies]
    assert answers[0] == answers[1] and answers[0] != answers[2]  # greedy: the image decides
    assert answers[3] and text["choices"][0]["message"]["content"]
    server.wait_idle()


def test_a_corrupt_image_is_a_400_naming_it(server: PipelineServer) -> None:
    corrupt = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" * 8).decode()
    with httpx.Client(base_url=server.url, timeout=60) as http:
        reply = http.post(CHAT, json=_body(corrupt))
        assert reply.status_code == 400, reply.text
        assert "cannot decode" in reply.json()["error"]["message"]
        ok = http.post(CHAT, json=_body(_png(np.zeros((32, 32, 3), np.uint8))))
        assert ok.status_code == 200, ok.text
