"""Bagel's per-request options through the server (`extra_args`, vLLM-Omni's name) on the
built-in demo-bagel: `think` (the understanding stage's) and the guidance options (the draw
stage's) give, through chat completions with image output and through
`/v1/images/generations`, exactly what the offline `Omni` gives for the same request (the
thinking's text, the image's pixels), streamed as whole; `think` with a text answer is the
offline text-only request's; bad ones are 400s in OpenAI's error shape naming the option,
and the server keeps serving."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from omnistage.diffusion.params import DiffusionParams
from omnistage.entrypoints.openai.pipeline_deploy import pipeline_deploy
from omnistage.pipeline.omni import Omni
from omnistage.sampling_params import SamplingParams
from tests.server.conftest import PipelineServer
from tests.server.test_chat_images import pixels, png_of, streamed

MODEL = "demo-bagel"
PROMPT = "a red cube"
DRAW = {"height": 16, "width": 16, "num_inference_steps": 2, "guidance_scale": 3.0, "seed": 5}
FIELDS = {"size": "16x16", "num_inference_steps": 2, "guidance_scale": 3.0, "seed": 5}
OPTIONS = {"think": True, "cfg_img_scale": 1.5, "cfg_interval": [0.0, 1.0]}


@pytest.fixture(scope="module")
def bagel() -> Iterator[PipelineServer]:
    with PipelineServer(MODEL) as live:
        yield live


@pytest.fixture(scope="module")
def offline() -> Iterator[Omni]:
    spec = pipeline_deploy(MODEL, None)
    with Omni(spec, in_process=True) as omni:
        yield omni


def offline_draw(omni: Omni, understanding: dict, draw_options: dict) -> tuple[str, np.ndarray]:
    """(the understanding stage's text, the image) of the offline request."""
    (entry,) = omni.deploy.entry_stages
    params = {
        "understanding": SamplingParams(**{**entry.default_sampling, **understanding}),
        "draw": DiffusionParams(**DRAW, model_options=draw_options),
    }
    (out,) = omni.generate([{"messages": [{"role": "user", "content": PROMPT}]}], params)
    assert out.error is None, out.error
    return out.outputs["understanding"].text, out.image_array


def chat(url: str, **extra) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "modalities": ["text", "image"],
        **FIELDS,
        **extra,
    }
    body = {k: v for k, v in body.items() if v is not None}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)


def test_chat_think_and_guidance_options_equal_offline(bagel, offline) -> None:
    response = chat(bagel.url, max_tokens=3, extra_args=OPTIONS)
    assert response.status_code == 200, response.text
    message = response.json()["choices"][0]["message"]
    think = {"seed": 5, "max_tokens": 3, "model_options": {"think": True}}
    draw_options = {"cfg_img_scale": 1.5, "cfg_interval": [0.0, 1.0]}
    text, image = offline_draw(offline, think, draw_options)
    assert message["content"] == text
    assert response.json()["usage"]["completion_tokens"] == 3  # the thinking, not one token
    served = pixels(png_of(message["images"][0]["image_url"]["url"]))
    assert np.array_equal(served, image)
    _, no_think = offline_draw(offline, {"seed": 5, "max_tokens": 3}, draw_options)
    _, no_guidance_options = offline_draw(offline, think, {})
    assert not np.array_equal(no_think, image)  # each option reached its stage
    assert not np.array_equal(no_guidance_options, image)
    bagel.wait_idle()


def test_streamed_chat_thinks_as_the_whole_one(bagel) -> None:
    whole = chat(bagel.url, max_tokens=3, extra_args=OPTIONS).json()["choices"][0]["message"]
    chunks, text = streamed(bagel.url, max_tokens=3, extra_args=OPTIONS)
    (image,) = [c["delta"]["images"][0] for c in chunks if c["delta"].get("images")]
    assert text == whole["content"]
    assert png_of(image["image_url"]["url"]) == png_of(whole["images"][0]["image_url"]["url"])
    bagel.wait_idle()


def test_text_answer_with_think_equals_offline(bagel, offline) -> None:
    """`think` without an image to draw: the understanding stage thinks (Bagel's reasoning
    system prompt) and answers in text; offline, the same request asks for text only."""
    messages = [{"role": "user", "content": PROMPT}]
    body = {"model": MODEL, "messages": messages, "max_tokens": 4, "extra_args": {"think": True}}
    response = httpx.post(f"{bagel.url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    (entry,) = offline.deploy.entry_stages
    fields = {**entry.default_sampling, "max_tokens": 4}
    outs = [
        offline.generate(
            [{"messages": messages}],
            {"understanding": SamplingParams(**fields, model_options=options)},
            modalities=["text"],
        )[0]
        for options in ({"think": True}, None)
    ]
    assert all(o.error is None for o in outs)
    think, plain = (o.outputs["understanding"] for o in outs)
    assert response.json()["choices"][0]["message"]["content"] == think.text
    assert think.token_ids != plain.token_ids  # the thinking prompt, not the plain one
    bagel.wait_idle()


def test_images_endpoint_think_equals_offline(bagel, offline) -> None:
    body = {"model": MODEL, "prompt": PROMPT, **FIELDS, "extra_args": {"think": True}}
    response = httpx.post(f"{bagel.url}/v1/images/generations", json=body, timeout=120)
    assert response.status_code == 200, response.text
    served = pixels(base64.b64decode(response.json()["data"][0]["b64_json"]))
    # the entry stage's deploy defaults (greedy, one token) with `think`; the seed draws
    _, image = offline_draw(offline, {"model_options": {"think": True}}, {})
    _, plain = offline_draw(offline, {}, {})
    assert np.array_equal(served, image) and not np.array_equal(served, plain)
    bagel.wait_idle()


TEXT_ONLY = {
    "modalities": ["text"],
    "size": None,
    "num_inference_steps": None,
    "guidance_scale": None,
}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"extra_args": {"think": "yes"}}, "think"),
        ({"extra_args": {"thinc": True}}, "thinc"),
        ({"extra_args": {"cfg_img_scale": -1}}, "cfg_img_scale"),
        ({"extra_args": {"cfg_interval": [0.5]}}, "cfg_interval"),
        ({"extra_args": ["think"]}, "extra_args"),
        ({"extra_args": {"cfg_img_scale": 2.0}, **TEXT_ONLY}, "cfg_img_scale"),  # no image
    ],
)
def test_bad_chat_options_are_400_and_the_server_keeps_serving(bagel, extra, param) -> None:
    response = chat(bagel.url, **extra)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"].startswith(f"{param}: ") or param == "extra_args"
    assert chat(bagel.url).status_code == 200  # still serving
    bagel.wait_idle()


def test_bad_image_endpoint_options_are_400(bagel) -> None:
    url = f"{bagel.url}/v1/images/generations"
    body = {"model": MODEL, "prompt": PROMPT, "size": "16x16"}
    for options, param in (({"thinc": 1}, "thinc"), ({"timestep_shift": 0}, "timestep_shift")):
        response = httpx.post(url, json=body | {"extra_args": options}, timeout=60)
        assert response.status_code == 400 and response.json()["error"]["param"] == param
    image = {"image": ("in.png", png_of(_red_png()), "image/png")}
    edits = f"{bagel.url}/v1/images/edits"
    for form, param in (
        ({"prompt": "x", "extra_args": '{"think": true}'}, "think"),  # no thinking on an edit
        ({"prompt": "x", "extra_args": "{}", "model_options": '{"a": 1}'}, "extra_args"),
        ({"prompt": "x", "extra_args": "[1]"}, "extra_args"),
    ):
        response = httpx.post(edits, data=form, files=image, timeout=60)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == param
    assert httpx.post(url, json=body, timeout=60).status_code == 200
    bagel.wait_idle()


def _red_png() -> str:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (255, 0, 0)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
