"""`chat_template_kwargs` (vLLM's field) on chat completions: HunyuanImage-3's `bot_task`
(think_recaption, recaption, image) through the server gives exactly what the offline
`Omni` gives for the same chat (the thinker's text and the image's pixels), on the tiny
checkpoint with `demo-hunyuan-image3`'s deploy; a value the template refuses, a field that
is no object and a name the render itself takes are 400s naming the field, and the server
keeps serving."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import yaml

from omnistage.diffusion.params import DiffusionParams
from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.pipeline_client import PipelineClient
from omnistage.families.hunyuan_image3.tiny import make_tiny_hunyuan_image3
from omnistage.pipeline.deploy import load_deploy, packaged_deploy_path
from omnistage.pipeline.omni import Omni
from omnistage.sampling_params import SamplingParams
from tests.server.conftest import _ThreadedServer
from tests.server.test_chat_images import pixels, png_of

NAME = "hunyuan-image3-tiny"
FIELDS = {"size": "64x64", "num_inference_steps": 2, "guidance_scale": 2.5, "seed": 0}
DRAW = {"height": 64, "width": 64, "num_inference_steps": 2, "guidance_scale": 2.5, "seed": 0}
PROMPT = "a red fox"


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    path = make_tiny_hunyuan_image3(tmp_path_factory.mktemp("hy3k"), image_base_size=64)
    raw = yaml.safe_load(packaged_deploy_path("demo-hunyuan-image3").read_text())
    return load_deploy(raw).with_model(str(path))


@pytest.fixture(scope="module")
def hunyuan(spec) -> Iterator[_ThreadedServer]:
    client = PipelineClient(spec, in_process=True)
    app = build_app(client, [NAME], model_path=spec.stages[0].model)
    with _ThreadedServer(app, client) as live:
        yield live


@pytest.fixture(scope="module")
def offline(spec) -> Iterator[Omni]:
    with Omni(spec, in_process=True) as omni:
        yield omni


def chat(url: str, **extra) -> httpx.Response:
    messages = [{"role": "user", "content": PROMPT}]
    body = {"model": NAME, "messages": messages, "modalities": ["text", "image"], **FIELDS}
    return httpx.post(f"{url}/v1/chat/completions", json=body | extra, timeout=120)


def offline_answer(omni: Omni, bot_task: str) -> tuple[str, np.ndarray]:
    (thinker,) = omni.deploy.entry_stages
    prompt = {
        "messages": [{"role": "user", "content": PROMPT}],
        "chat_template_kwargs": {"bot_task": bot_task},
    }
    params = {
        "thinker": SamplingParams(**{**thinker.default_sampling, "seed": 0}),
        "draw": DiffusionParams(**DRAW),
    }
    (out,) = omni.generate([prompt], params)
    assert out.error is None, out.error
    return out.outputs["thinker"].text, out.image_array


@pytest.mark.parametrize("bot_task", ["think_recaption", "recaption", "image"])
def test_bot_task_through_chat_equals_offline(hunyuan, offline, bot_task) -> None:
    response = chat(hunyuan.url, chat_template_kwargs={"bot_task": bot_task})
    assert response.status_code == 200, response.text
    message = response.json()["choices"][0]["message"]
    text, image = offline_answer(offline, bot_task)
    assert message["content"] == text
    assert np.array_equal(pixels(png_of(message["images"][0]["image_url"]["url"])), image)


def test_bot_tasks_differ_and_the_default_is_think_recaption(hunyuan) -> None:
    answers = {}
    for task in (None, "think_recaption", "recaption", "image"):
        extra = {} if task is None else {"chat_template_kwargs": {"bot_task": task}}
        answers[task] = chat(hunyuan.url, **extra).json()["choices"][0]["message"]["content"]
    assert answers[None] == answers["think_recaption"]
    assert len({answers["think_recaption"], answers["recaption"], answers["image"]}) == 3


@pytest.mark.parametrize(
    ("kwargs", "param", "says"),
    [
        ({"bot_task": "think"}, "bot_task", "expected one of"),  # the template refuses it
        (["bot_task"], "chat_template_kwargs", ""),
        ("recaption", "chat_template_kwargs", ""),
        ({"add_generation_prompt": False}, "chat_template_kwargs", "add_generation_prompt"),
    ],
)
def test_bad_chat_template_kwargs_are_400(hunyuan, kwargs, param, says) -> None:
    response = chat(hunyuan.url, chat_template_kwargs=kwargs)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and says in error["message"]
    assert chat(hunyuan.url).status_code == 200  # still serving
