"""HunyuanImage-3 image-to-text behind the OpenAI server: chat completions with an image in
the messages on the tiny checkpoint with the demo's deploy (stages in the server process)
answer text from the thinker (the draw stage is not asked for: the chat answers text
only); a corrupt, oversized or wrongly addressed image is a 400 naming the part."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import yaml
from PIL import Image

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.pipeline_client import PipelineClient
from omnistage.families.hunyuan_image3.tiny import make_tiny_hunyuan_image3
from omnistage.pipeline.deploy import load_deploy, packaged_deploy_path
from tests.server.conftest import _ThreadedServer

NAME = "hunyuan-image3-tiny"
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[_ThreadedServer]:
    path = make_tiny_hunyuan_image3(tmp_path_factory.mktemp("hy3s"))
    spec = yaml.safe_load(packaged_deploy_path("demo-hunyuan-image3").read_text())
    client = PipelineClient(load_deploy(spec).with_model(str(path)), in_process=True)
    with _ThreadedServer(build_app(client, [NAME], model_path=str(path)), client) as live:
        yield live


def _png(array: np.ndarray) -> str:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _body(url: str) -> dict:
    content = [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "What is in it?"},
    ]
    messages = [{"role": "user", "content": content}]
    return {"model": NAME, "messages": messages, "max_tokens": 8, "temperature": 0}


def test_chat_with_an_image_answers_text_that_depends_on_it(server) -> None:
    rng = np.random.RandomState(0)
    first, second = (rng.randint(0, 256, (20, 60, 3)).astype(np.uint8) for _ in range(2))
    with httpx.Client(base_url=server.url, timeout=120) as http:
        answers = []
        for image in (first, first, second):
            reply = http.post(CHAT, json=_body(_png(image)))
            assert reply.status_code == 200, reply.text
            choice = reply.json()["choices"][0]
            assert choice["message"]["content"] and "image" not in choice["message"]
            answers.append(choice["message"]["content"])
    assert answers[0] == answers[1] and answers[0] != answers[2]  # greedy: the image decides


def test_bad_images_are_400_naming_the_part(server) -> None:
    buffer = io.BytesIO()
    Image.new("1", (9000, 9000)).save(buffer, format="PNG")
    bomb = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    corrupt = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" * 8).decode()
    cases = [
        (bomb, "pixels, over the limit"),
        (corrupt, "cannot decode"),
        ("file:///etc/passwd", "messages[0].content[0]"),
    ]
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for url, says in cases:
            reply = http.post(CHAT, json=_body(url))
            assert reply.status_code == 400, reply.text
            assert says in reply.json()["error"]["message"]
        assert http.post(CHAT, json=_body(_png(np.zeros((32, 32, 3), np.uint8)))).status_code == 200
