"""`/v1/images/generations` serves the built-in demo-bagel through the existing image path:
the understanding stage prefills, the draw stage draws; a seed gives the same PNG twice,
and a size the model cannot draw (not a multiple of VAE x patch, 4 pixels for the demo,
or past its 8 x 8 patch grid) is a 400 naming `size`."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import numpy as np
import openai
import pytest
from PIL import Image

from tests.server.conftest import PipelineServer


@pytest.fixture(scope="module")
def bagel_server() -> Iterator[PipelineServer]:
    with PipelineServer("demo-bagel") as live:
        yield live


def _png(item) -> np.ndarray:
    image = Image.open(io.BytesIO(base64.b64decode(item.b64_json)))
    assert image.format == "PNG"
    return np.asarray(image)


def test_bagel_image_generation(bagel_server: PipelineServer) -> None:
    client = bagel_server.openai()
    body = {"seed": 5, "num_inference_steps": 2, "guidance_scale": 3.0}
    first = client.images.generate(
        model="demo-bagel", prompt="a red cube", size="16x16", n=2, extra_body=body
    )
    arrays = [_png(item) for item in first.data]
    assert arrays[0].shape == (16, 16, 3) and not np.array_equal(arrays[0], arrays[1])
    again = client.images.generate(
        model="demo-bagel", prompt="a red cube", size="16x16", extra_body=body
    )
    assert np.array_equal(_png(again.data[0]), arrays[0])
    bagel_server.wait_idle()


@pytest.mark.parametrize("size", ["18x16", "64x64"])
def test_bagel_bad_size_is_400(bagel_server: PipelineServer, size: str) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        bagel_server.openai().images.generate(model="demo-bagel", prompt="x", size=size)  # type: ignore[arg-type]
    error = exc.value.response.json()["error"]
    assert error["param"] == "size" and "size" in error["message"]


def _upload(array: np.ndarray, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format=fmt)
    return buffer.getvalue()


INPUT = np.random.default_rng(11).integers(0, 256, size=(24, 32, 3), dtype=np.uint8)


def test_bagel_image_edit(bagel_server: PipelineServer) -> None:
    """`/v1/images/edits` (OpenAI's multipart form): drawn at the input's size by default,
    the same PNG for the same seed, another for other `model_options`."""
    client = bagel_server.openai()
    body = {"seed": 3, "num_inference_steps": 2, "guidance_scale": 3.0}
    first = client.images.edit(
        image=("in.png", _upload(INPUT), "image/png"),
        prompt="make it blue",
        n=2,
        extra_body=body,
    )
    arrays = [_png(item) for item in first.data]
    assert arrays[0].shape == (24, 32, 3) and not np.array_equal(arrays[0], arrays[1])
    again = client.images.edit(
        image=("in.png", _upload(INPUT), "image/png"), prompt="make it blue", extra_body=body
    )
    assert np.array_equal(_png(again.data[0]), arrays[0])
    tuned = client.images.edit(
        image=("in.png", _upload(INPUT), "image/png"),
        prompt="make it blue",
        size="16x16",
        extra_body=body | {"model_options": '{"cfg_img_scale": 2.0, "cfg_interval": [0, 1]}'},
    )
    assert _png(tuned.data[0]).shape == (16, 16, 3)
    bagel_server.wait_idle()


@pytest.mark.parametrize(
    ("form", "files", "param"),
    [
        ({}, {"image": ("in.png", _upload(INPUT), "image/png")}, "prompt"),
        ({"prompt": "x"}, {}, "image"),
        ({"prompt": "x"}, {"image": ("in.png", b"not an image", "image/png")}, "image"),
        ({"prompt": "x", "n": "11"}, {"image": ("in.png", _upload(INPUT), "image/png")}, "n"),
        ({"prompt": "x", "n": "two"}, {"image": ("in.png", _upload(INPUT), "image/png")}, "n"),
        (
            {"prompt": "x", "size": "18x16"},
            {"image": ("in.png", _upload(INPUT), "image/png")},
            "size",
        ),
        (
            {"prompt": "x"},
            {"image": ("big.png", _upload(np.zeros((40, 40, 3), np.uint8)), "image/png")},
            "size",
        ),
        (
            {"prompt": "x", "model_options": '{"cfg_img_scale": -1}'},
            {"image": ("in.png", _upload(INPUT), "image/png")},
            "cfg_img_scale",
        ),
        (
            {"prompt": "x", "model_options": "[1]"},
            {"image": ("in.png", _upload(INPUT), "image/png")},
            "model_options",
        ),
    ],
)
def test_bagel_bad_edit_is_400(bagel_server: PipelineServer, form, files, param) -> None:
    import httpx

    response = httpx.post(f"{bagel_server.url}/v1/images/edits", data=form, files=files, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_bagel_oversized_image_is_400(bagel_server: PipelineServer, monkeypatch) -> None:
    import httpx

    from omnistage.entrypoints.openai import serving_image_edits

    monkeypatch.setattr(serving_image_edits, "MAX_IMAGE_BYTES", 100)
    files = {"image": ("in.png", _upload(INPUT), "image/png")}
    response = httpx.post(
        f"{bagel_server.url}/v1/images/edits", data={"prompt": "x"}, files=files, timeout=60
    )
    assert response.status_code == 400 and response.json()["error"]["param"] == "image"
    bagel_server.wait_idle()


def test_bagel_chat_with_an_image_answers_in_text(bagel_server: PipelineServer) -> None:
    """Chat completions with an image part: the understanding stage answers (greedy, the
    understanding expert over the image's ViT block and the question), the same twice;
    another image gives another answer; a corrupt image is a 400."""
    client = bagel_server.openai()

    def ask(array: np.ndarray) -> object:
        url = "data:image/png;base64," + base64.b64encode(_upload(array)).decode()
        content = [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "describe the image"},
        ]
        return client.chat.completions.create(
            model="demo-bagel",
            messages=[{"role": "user", "content": content}],
            max_tokens=5,
            temperature=0.0,
        )

    first, again = ask(INPUT), ask(INPUT)
    assert first.usage.completion_tokens == 5 and first.choices[0].finish_reason == "length"
    assert first.choices[0].message.content == again.choices[0].message.content
    other = ask(255 - INPUT)
    assert other.choices[0].message.content != first.choices[0].message.content
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="demo-bagel",
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                        {"type": "text", "text": "x"},
                    ],
                }
            ],
        )
    bagel_server.wait_idle()
