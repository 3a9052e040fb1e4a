"""HunyuanImage-3 image editing behind the OpenAI server: POST /v1/images/edits (multipart
image + prompt) on the tiny checkpoint (base size 256, drawn at 128 x 384) with `demo-hunyuan-image3`'s deploy,
stages in the server process.

- the edit is drawn (thinker over the image and the words, draw stage after the image's
  rows), the same PNG for the same seed, another for another input image;
- bad input is a 400 in the OpenAI error shape naming the field: an image Pillow cannot
  decode, one over the byte bound, none, and a size outside the resolution group;
- a chat completion with an image part and image output draws the same edit.
"""

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
INPUT = np.random.default_rng(5).integers(0, 256, size=(20, 60, 3), dtype=np.uint8)
FORM = {"prompt": "make it red", "size": "384x128", "seed": "3", "num_inference_steps": "2"}


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[_ThreadedServer]:
    path = make_tiny_hunyuan_image3(tmp_path_factory.mktemp("hy3"))
    spec = yaml.safe_load(packaged_deploy_path("demo-hunyuan-image3").read_text())
    spec["stages"][0]["default_sampling"]["max_tokens"] = 30
    client = PipelineClient(load_deploy(spec).with_model(str(path)), in_process=True)
    with _ThreadedServer(build_app(client, [NAME], model_path=str(path)), client) as live:
        yield live


def _upload(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, format="PNG")
    return out.getvalue()


def _edit(server, image: bytes, **form) -> httpx.Response:
    files = {"image": ("in.png", image, "image/png")}
    return httpx.post(f"{server.url}/v1/images/edits", data=FORM | form, files=files, timeout=120)


def _pixels(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    (item,) = response.json()["data"]
    image = Image.open(io.BytesIO(base64.b64decode(item["b64_json"])))
    assert image.format == "PNG"
    return np.asarray(image)


def test_edit_is_drawn_seeded_and_reads_the_image(server) -> None:
    first = _pixels(_edit(server, _upload(INPUT)))
    assert first.shape == (128, 384, 3) and first.std() > 0
    assert np.array_equal(_pixels(_edit(server, _upload(INPUT))), first)
    assert not np.array_equal(_pixels(_edit(server, _upload(255 - INPUT))), first)


@pytest.mark.parametrize(
    ("image", "form", "param"),
    [
        (b"not an image", {}, "image"),
        (None, {}, "image"),
        (_upload(INPUT), {"size": "64x48"}, "size"),
        (_upload(INPUT), {"prompt": ""}, "prompt"),
    ],
)
def test_bad_edit_is_400_naming_the_field(server, image, form, param) -> None:
    files = {} if image is None else {"image": ("in.png", image, "image/png")}
    url = f"{server.url}/v1/images/edits"
    response = httpx.post(url, data=FORM | form, files=files, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"].startswith(param)


def test_oversized_image_is_400(server, monkeypatch) -> None:
    from omnistage.entrypoints.openai import serving_image_edits

    monkeypatch.setattr(serving_image_edits, "MAX_IMAGE_BYTES", 100)
    response = _edit(server, _upload(INPUT))
    assert response.status_code == 400 and response.json()["error"]["param"] == "image"


def test_a_chat_with_an_image_part_and_image_output_draws_the_same_edit(server) -> None:
    """Chat completions with `modalities: ["text", "image"]` and an image part: the image
    drawn is the one `/v1/images/edits` draws from the same image, words, size, steps and
    seed (seed 0: a chat's seed seeds the thinker too, the edits endpoint leaves it 0)."""
    url = "data:image/png;base64," + base64.b64encode(_upload(INPUT)).decode()
    parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "add"}]
    body = {
        "model": NAME,
        "messages": [{"role": "user", "content": parts}],
        "modalities": ["text", "image"],
        "size": "384x128",
        "num_inference_steps": 2,
        "seed": 0,
        "max_tokens": 30,
    }
    chat = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
    assert chat.status_code == 200, chat.text
    (image,) = chat.json()["choices"][0]["message"]["images"]
    head, data = image["image_url"]["url"].split(",", 1)
    assert head == "data:image/png;base64"
    drawn = np.asarray(Image.open(io.BytesIO(base64.b64decode(data))))
    assert np.array_equal(drawn, _pixels(_edit(server, _upload(INPUT), prompt="add", seed="0")))
