"""Chat completions with image output on HunyuanImage-3 (one thinker that thinks and writes a
caption, then its image head draws): the answer's text is the thinker's, and its image
(`message.images`, streamed as one `delta.images` chunk) is the one
`/v1/images/generations` draws from the same prompt, size, steps, guidance and seed (seed 0:
a chat's seed seeds the thinker too, the images endpoint leaves it its default, 0)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import httpx
import pytest
import yaml

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.pipeline_client import PipelineClient
from omnistage.families.hunyuan_image3.tiny import make_tiny_hunyuan_image3
from omnistage.pipeline.deploy import load_deploy, packaged_deploy_path
from tests.server.conftest import _ThreadedServer
from tests.server.test_chat_images import pixels, png_of

NAME = "hunyuan-image3-tiny"
FIELDS = {"size": "64x64", "num_inference_steps": 2, "guidance_scale": 2.5, "seed": 0}
PROMPT = "a red fox"


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[_ThreadedServer]:
    path = make_tiny_hunyuan_image3(tmp_path_factory.mktemp("hy3"), image_base_size=64)
    spec = yaml.safe_load(packaged_deploy_path("demo-hunyuan-image3").read_text())
    client = PipelineClient(load_deploy(spec).with_model(str(path)), in_process=True)
    with _ThreadedServer(build_app(client, [NAME], model_path=str(path)), client) as live:
        yield live


def _body(**extra) -> dict:
    messages = [{"role": "user", "content": PROMPT}]
    return {"model": NAME, "messages": messages, "modalities": ["text", "image"], **FIELDS} | extra


def test_chat_image_whole_streamed_and_as_the_images_endpoint_draws(server) -> None:
    whole = httpx.post(f"{server.url}/v1/chat/completions", json=_body(), timeout=120)
    assert whole.status_code == 200, whole.text
    message = whole.json()["choices"][0]["message"]
    assert message["content"]  # the thinker's thought and caption
    (image,) = message["images"]
    png = png_of(image["image_url"]["url"])
    assert pixels(png).shape == (64, 64, 3)
    chunks = []
    url = f"{server.url}/v1/chat/completions"
    with httpx.stream("POST", url, json=_body(stream=True), timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: ") :])["choices"][0])
    images = [c["delta"]["images"] for c in chunks if c["delta"].get("images")]
    assert len(images) == 1 and png_of(images[0][0]["image_url"]["url"]) == png
    assert "".join(c["delta"].get("content") or "" for c in chunks) == message["content"]
    drawn = httpx.post(
        f"{server.url}/v1/images/generations",
        json={"model": NAME, "prompt": PROMPT, **FIELDS},
        timeout=120,
    )
    assert drawn.status_code == 200, drawn.text
    png_drawn = base64.b64decode(drawn.json()["data"][0]["b64_json"])
    assert (pixels(png_drawn) == pixels(png)).all()


def test_a_size_outside_the_resolution_group_is_400_naming_it(server) -> None:
    response = httpx.post(f"{server.url}/v1/chat/completions", json=_body(size="48x64"), timeout=60)
    assert response.status_code == 400 and response.json()["error"]["param"] == "size"
