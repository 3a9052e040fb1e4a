"""Chat completions with image output on the built-in demo-bagel (understanding -> KV hand-off
-> draw), in OpenRouter's shape: `modalities: ["text", "image"]` gives `message.images`, one
PNG data URL, beside the text; streamed, one chunk with `delta.images` before the finish
reason. The image is the one `/v1/images/generations` draws with the same prompt and fields,
whole and streamed alike, and the same under sync and async scheduling of the
understanding stage. Bad image fields are 400s naming them."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from PIL import Image

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.pipeline_client import PipelineClient
from omnistage.entrypoints.openai.pipeline_deploy import pipeline_deploy
from tests.server.conftest import PipelineServer, _ThreadedServer

MODEL = "demo-bagel"
FIELDS = {"size": "16x16", "num_inference_steps": 2, "guidance_scale": 3.0, "seed": 5}
PROMPT = "a red cube"


@pytest.fixture(scope="module")
def bagel() -> Iterator[PipelineServer]:
    with PipelineServer(MODEL) as live:
        yield live


def chat(url: str, **extra) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "modalities": ["text", "image"],
        **FIELDS,
        **extra,
    }
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)


def png_of(url: str) -> bytes:
    head, data = url.split(",", 1)
    assert head == "data:image/png;base64"
    return base64.b64decode(data)


def pixels(png: bytes) -> np.ndarray:
    image = Image.open(io.BytesIO(png))
    assert image.format == "PNG"
    return np.asarray(image)


def streamed(url: str, **extra) -> tuple[list[dict], str]:
    """The chunks of a streamed chat (each chunk's first choice's delta and finish reason)."""
    chunks = []
    with httpx.stream(
        "POST",
        f"{url}/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": PROMPT}],
            "modalities": ["text", "image"],
            "stream": True,
            **FIELDS,
            **extra,
        },
        timeout=120,
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: ") :])["choices"][0])
    text = "".join(c["delta"].get("content") or "" for c in chunks)
    return chunks, text


def test_chat_returns_the_image_whole_and_streamed(bagel: PipelineServer) -> None:
    whole = chat(bagel.url)
    assert whole.status_code == 200, whole.text
    message = whole.json()["choices"][0]["message"]
    assert isinstance(message["content"], str)
    ((image,),) = [message["images"]]
    assert image["type"] == "image_url"
    png = png_of(image["image_url"]["url"])
    assert pixels(png).shape == (16, 16, 3)
    chunks, text = streamed(bagel.url)
    with_images = [i for i, c in enumerate(chunks) if c["delta"].get("images")]
    assert len(with_images) == 1 and chunks[-1]["finish_reason"] is not None
    assert with_images[0] < len(chunks) - 1  # the image, then the finish reason
    (streamed_image,) = chunks[with_images[0]]["delta"]["images"]
    assert png_of(streamed_image["image_url"]["url"]) == png and text == message["content"]
    drawn = bagel.openai().images.generate(
        model=MODEL,
        prompt=PROMPT,
        size="16x16",
        extra_body={k: v for k, v in FIELDS.items() if k != "size"},
    )
    assert np.array_equal(pixels(base64.b64decode(drawn.data[0].b64_json)), pixels(png))
    other = chat(bagel.url, seed=6).json()["choices"][0]["message"]["images"][0]
    assert png_of(other["image_url"]["url"]) != png
    bagel.wait_idle()


def test_image_only_and_text_only_answers(bagel: PipelineServer) -> None:
    only = chat(bagel.url, modalities=["image"]).json()["choices"][0]["message"]
    assert only["content"] == "" and len(only["images"]) == 1
    text = {k: v for k, v in FIELDS.items() if k == "seed"}
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], **text}
    plain = httpx.post(f"{bagel.url}/v1/chat/completions", json=body, timeout=60).json()
    assert plain["choices"][0]["message"].get("images") is None
    bagel.wait_idle()


def test_sync_and_async_scheduling_give_the_same_png(bagel: PipelineServer) -> None:
    """demo-bagel schedules its stages asynchronously (the default); the same deploy with
    sync scheduling answers the same chat with the same PNG bytes."""
    spec = pipeline_deploy(MODEL, None)
    assert spec is not None and all(
        s.engine_args.get("async_scheduling", True) for s in spec.stages
    )
    client = PipelineClient(spec.with_engine_args({"async_scheduling": False}), in_process=True)
    with _ThreadedServer(build_app(client, [MODEL], model_path=MODEL), client) as sync:
        sync_png = image_of(chat(sync.url))
    assert sync_png == image_of(chat(bagel.url))


def image_of(response: httpx.Response) -> bytes:
    assert response.status_code == 200, response.text
    (image,) = response.json()["choices"][0]["message"]["images"]
    return png_of(image["image_url"]["url"])


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"size": "18x16"}, "size"),
        ({"size": "big"}, "size"),
        ({"size": "64x64"}, "size"),
        ({"num_inference_steps": 0}, "num_inference_steps"),
        ({"guidance_scale": -1.0}, "guidance_scale"),
        ({"seed": -1}, "seed"),
        ({"modalities": ["text"]}, "size"),
        ({"modalities": ["audio"]}, "modalities"),
    ],
)
def test_bad_image_fields_are_400_naming_them(bagel: PipelineServer, extra, param) -> None:
    response = chat(bagel.url, **extra)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.text
