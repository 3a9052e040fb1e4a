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
