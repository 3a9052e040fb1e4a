"""Chat completions with GLM-Image, a pipeline that draws but writes no text: a chat's
answer is the image alone (`modalities` defaults to `["image"]`; `content` empty), the same
whole and streamed for a seeded greedy request; asking it for text is a 400 naming
`modalities`, and so is asking a text model for an image."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.pipeline_client import PipelineClient
from omnistage.families.glm_image.tiny import make_tiny_glm_image
from omnistage.pipeline.deploy import deploy_for_model
from tests.server.conftest import _ThreadedServer
from tests.server.test_chat_images import pixels, png_of

NAME = "glm-image-tiny"
BODY = {
    "model": NAME,
    "messages": [{"role": "user", "content": "a cat"}],
    "size": "64x96",
    "num_inference_steps": 1,
    "seed": 3,
    "temperature": 0.0,
}


@pytest.fixture(scope="module")
def glm(tmp_path_factory) -> Iterator[_ThreadedServer]:
    path = make_tiny_glm_image(tmp_path_factory.mktemp("glm-image"))
    client = PipelineClient(deploy_for_model(str(path)), in_process=True)
    with _ThreadedServer(build_app(client, [NAME], model_path=str(path)), client) as live:
        yield live


def test_chat_answers_with_the_image_alone(glm) -> None:
    url = f"{glm.url}/v1/chat/completions"
    whole = httpx.post(url, json=BODY, timeout=120)
    assert whole.status_code == 200, whole.text
    message = whole.json()["choices"][0]["message"]
    assert message["content"] == ""
    (image,) = message["images"]
    png = png_of(image["image_url"]["url"])
    assert pixels(png).shape == (96, 64, 3)
    chunks = []
    with httpx.stream("POST", url, json=BODY | {"stream": True}, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: ") :])["choices"][0])
    (streamed,) = [c["delta"]["images"] for c in chunks if c["delta"].get("images")]
    assert png_of(streamed[0]["image_url"]["url"]) == png
    refused = httpx.post(url, json=BODY | {"modalities": ["text", "image"]}, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "modalities"


def test_a_text_model_draws_no_image(client) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"modalities": ["text", "image"]},
        )
    assert exc.value.response.json()["error"]["param"] == "modalities"
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], extra_body={"size": "8x8"}
        )
    assert exc.value.response.json()["error"]["param"] == "size"
