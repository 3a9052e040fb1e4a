"""The built-in demo-dynin-omni served through the existing endpoints: listed by
`omnistage models`; chat completions answer with token2text's text (one output per
request: asking image and audio is a 400 naming `modalities`); `/v1/images/generations` returns token2image's MAGVITv2 decode as a
PNG (the same prompt and seed, the same image; the seed goes to token2text, which samples
the codes); asking its fixed-size decoder for a size or diffusion settings or an empty prompt is a 400 naming the
field (a long image prompt is cut by Dynin's template, as the reference does); `/v1/audio/speech` and chat with audio out speak through EMOVA's unit-to-speech decoder
(22050 Hz; the voices are its style conditions; an unknown voice is a 400 naming `voice`)."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile
from PIL import Image

from omnistage.models import builtin
from tests.server.conftest import PipelineServer

MODEL = "demo-dynin-omni"


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[PipelineServer]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMNISTAGE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        with PipelineServer(MODEL) as live:
            yield live


def _image(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    (item,) = response.json()["data"]
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(item["b64_json"]))))


def _post(server: PipelineServer, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json={"model": MODEL, **body}, timeout=120)


def test_listed_by_omnistage_models() -> None:
    assert "Dynin-Omni" in builtin.builtin_models()[MODEL]


def test_image_generation_is_the_decoded_codes(server: PipelineServer) -> None:
    first = _image(_post(server, "/v1/images/generations", {"prompt": "a cat"}))
    again = _image(_post(server, "/v1/images/generations", {"prompt": "a cat"}))
    other = _image(_post(server, "/v1/images/generations", {"prompt": "a blue boat"}))
    assert first.shape == (8, 8, 3)
    assert np.array_equal(first, again) and not np.array_equal(first, other)
    seeded = [
        _image(_post(server, "/v1/images/generations", {"prompt": "a cat", "seed": s}))
        for s in (5, 5, 6)
    ]
    assert np.array_equal(seeded[0], seeded[1]) and not np.array_equal(seeded[0], seeded[2])
    server.wait_idle()


def test_chat_answer_is_dynins_mmu_answer(server: PipelineServer, tmp_path) -> None:
    """The chat goes through Dynin's chat layout (the tiny tokenizer's template): the answer
    is the reference's `mmu_generate` answer to vLLM-Omni's t2t prompt (the mmu fixture)."""
    from transformers import AutoTokenizer

    from omnistage.families.dynin_omni.tiny import make_tiny_dynin_omni

    reference = np.load(Path(__file__).parents[1] / "fixtures/dynin_omni/mmu_reference.npz")
    prompt, ids = reference["mmu_prompt/0"], reference["mmu_text/0"]
    tokenizer = AutoTokenizer.from_pretrained(str(make_tiny_dynin_omni(tmp_path / "t")))
    answer = ids[prompt.size :].tolist()
    answer = (
        answer[: answer.index(tokenizer.eos_token_id)]
        if tokenizer.eos_token_id in answer
        else answer
    )
    response = _post(
        server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hello"}]}
    )
    assert response.status_code == 200, response.text
    content = response.json()["choices"][0]["message"]["content"]
    assert content == tokenizer.decode(answer, skip_special_tokens=True)
    server.wait_idle()


def test_chat_answers_about_an_image_url(server: PipelineServer, tmp_path) -> None:
    """An `image_url` part goes through token2text's MAGVITv2 encoder into Dynin's mmu
    prompt: the answer is the i2t fixture's (vLLM-Omni's i2t example on the same image)."""
    from transformers import AutoTokenizer

    from omnistage.families.dynin_omni.tiny import make_tiny_dynin_omni

    reference = np.load(Path(__file__).parents[1] / "fixtures/dynin_omni/mmu_reference.npz")
    png = io.BytesIO()
    Image.fromarray(reference["image/0"]).save(png, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    question = {"type": "text", "text": "What is in the image?"}
    content = [{"type": "image_url", "image_url": {"url": url}}, question]
    response = _post(
        server, "/v1/chat/completions", {"messages": [{"role": "user", "content": content}]}
    )
    assert response.status_code == 200, response.text
    tokenizer = AutoTokenizer.from_pretrained(str(make_tiny_dynin_omni(tmp_path / "t")))
    answer = reference["i2t_text/0"][reference["i2t_prompt/0"].size :].tolist()
    if tokenizer.eos_token_id in answer:
        answer = answer[: answer.index(tokenizer.eos_token_id)]
    expected = tokenizer.decode(answer, skip_special_tokens=True)
    assert response.json()["choices"][0]["message"]["content"] == expected
    models = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"]
    assert "image" in next(m for m in models if m["id"] == MODEL)["input_modalities"]
    two = {"messages": [{"role": "user", "content": [content[0], content[0], question]}]}
    bad = _post(server, "/v1/chat/completions", two)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "multi_modal_data", bad.text
    server.wait_idle()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "a cat", "size": "64x64"}, "size"),
        ({"prompt": "a cat", "num_inference_steps": 4}, "num_inference_steps"),
        ({"prompt": ""}, "prompt"),
    ],
)
def test_bad_image_request_is_400_naming_the_field(
    server: PipelineServer, body: dict, param: str
) -> None:
    response = _post(server, "/v1/images/generations", body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"].startswith(f"{param}:")
    server.wait_idle()


def test_chat_answers_with_token2text(server: PipelineServer) -> None:
    hello = {"messages": [{"role": "user", "content": "hello"}]}
    first = _post(server, "/v1/chat/completions", hello)
    again = _post(server, "/v1/chat/completions", {**hello, "modalities": ["text"]})
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["choices"][0]["message"]["content"]
    assert body["usage"]["completion_tokens"] > 0
    assert (
        again.json()["choices"][0]["message"]["content"] == body["choices"][0]["message"]["content"]
    )
    server.wait_idle()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"modalities": ["text", "image", "audio"]}, "modalities"),
        ({"messages": [{"role": "user", "content": "x" * 600}]}, "messages"),
    ],
)
def test_bad_chat_request_is_400_naming_the_field(
    server: PipelineServer, body: dict, param: str
) -> None:
    request = {"messages": [{"role": "user", "content": "hi"}], **body}
    response = _post(server, "/v1/chat/completions", request)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    server.wait_idle()


def _samples(data: bytes) -> np.ndarray:
    samples, rate = soundfile.read(io.BytesIO(data), dtype="int16")
    assert rate == 22050 and samples.size > 0
    return samples


def test_speech_speaks_through_the_emova_decoder(server: PipelineServer) -> None:
    first = _post(server, "/v1/audio/speech", {"input": "hi"})
    assert first.status_code == 200, first.text
    again = _post(server, "/v1/audio/speech", {"input": "hi"})
    styled = _post(
        server,
        "/v1/audio/speech",
        {"input": "hi", "voice": "gender-male_emotion-sad_speed-slow_pitch-low"},
    )
    samples = _samples(first.content)
    assert np.array_equal(samples, _samples(again.content))
    other = _samples(styled.content)
    assert other.size != samples.size or not np.array_equal(other, samples)
    bad = _post(server, "/v1/audio/speech", {"input": "hi", "voice": "alice"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "voice", bad.text
    server.wait_idle()


def test_chat_with_audio_out_speaks(server: PipelineServer) -> None:
    body = {"messages": [{"role": "user", "content": "hello"}], "modalities": ["text", "audio"]}
    response = _post(server, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    audio = response.json()["choices"][0]["message"]["audio"]
    assert _samples(base64.b64decode(audio["data"])).size > 0
    server.wait_idle()
