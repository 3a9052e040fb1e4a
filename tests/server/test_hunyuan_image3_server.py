"""HunyuanImage-3 behind the OpenAI server: POST /v1/images/generations on the tiny
checkpoint (base size 64: only sizes of its resolution group that are multiples of 16,
64x64 among them) with the demo's deploy, stages in the server process."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import numpy as np
import openai
import pytest
import yaml
from PIL import Image

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.pipeline_client import PipelineClient
from omnistage.families.hunyuan_image3.tiny import make_tiny_hunyuan_image3
from omnistage.pipeline.deploy import load_deploy, packaged_deploy_path
from tests.server.conftest import _ThreadedServer

NAME = "hunyuan-image3-tiny"


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[_ThreadedServer]:
    path = make_tiny_hunyuan_image3(tmp_path_factory.mktemp("hy3"), image_base_size=64)
    spec = yaml.safe_load(packaged_deploy_path("demo-hunyuan-image3").read_text())
    client = PipelineClient(load_deploy(spec).with_model(str(path)), in_process=True)
    with _ThreadedServer(build_app(client, [NAME], model_path=str(path)), client) as live:
        yield live


def _client(server: _ThreadedServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)


def test_image_generation_returns_the_seeded_png(server) -> None:
    client = _client(server)
    extra = {"seed": 3, "num_inference_steps": 2, "guidance_scale": 2.5}
    result = client.images.generate(
        model=NAME, prompt="a red fox", size="64x64", n=2, extra_body=extra
    )
    arrays = []
    for item in result.data:
        image = Image.open(io.BytesIO(base64.b64decode(item.b64_json)))
        assert image.format == "PNG" and image.size == (64, 64)
        arrays.append(np.asarray(image))
    assert not np.array_equal(arrays[0], arrays[1])  # seeds 3 and 4
    again = client.images.generate(model=NAME, prompt="a red fox", size="64x64", extra_body=extra)
    image = np.asarray(Image.open(io.BytesIO(base64.b64decode(again.data[0].b64_json))))
    assert np.array_equal(image, arrays[0])


def test_size_outside_the_resolution_group_is_400_naming_it(server) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        _client(server).images.generate(model=NAME, prompt="x", size="48x64")  # type: ignore[arg-type]
    message = exc.value.response.json()["error"]["message"]
    assert message.startswith("size: 48x64 is not supported") and "64x48 is not one of" in message
