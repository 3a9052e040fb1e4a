"""Bad requests get a 4xx in OpenAI's error shape, naming the problem; never a 5xx."""

from __future__ import annotations

import json
import re

import openai
import pytest

from tests.server.conftest import TINY

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "user", "content": "hi"}]
SERVER_INSIDES = re.compile(r"0x[0-9a-f]{6,}|Traceback|File \"")
"""A memory address or a stack trace: never in an answer."""


def _error(response, status: int, param: str | None = None, says: str = "") -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert says in error["message"], error["message"]
    assert not SERVER_INSIDES.search(response.text), response.text
    return error


def test_invalid_json(http):
    response = http.post(CHAT, content=b'{"model": "tiny", "messages": [', headers=_json())
    _error(response, 400, None, "invalid JSON")
    _error(http.post(CHAT, content=b"[1, 2]", headers=_json()), 400, None, "body")
    _error(http.post(CHAT, content=b"\xff\xfe", headers=_json()), 400, None, "")


def _json() -> dict:
    return {"content-type": "application/json"}


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("temperature", "hot", "temperature"),
        ("n", 1.5, "n"),
        ("max_tokens", "many", "max_tokens"),
        ("stream", "yes", "stream"),
        ("messages", "hi", "messages"),
        ("stop", 5, "stop"),
        ("logit_bias", ["a"], "logit_bias"),
        ("seed", 2**64, "seed"),
    ],
)
def test_wrong_types(http, field, value, says):
    body = {"model": TINY, "messages": MESSAGES, field: value}
    _error(http.post(CHAT, json=body), 400, field, says)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -1),
        ("top_p", 0),
        ("top_p", 1.5),
        ("n", 0),
        ("n", 1000),
        ("max_tokens", 0),
        ("presence_penalty", 3),
        ("frequency_penalty", -2.5),
        ("top_logprobs", 21),
        ("logit_bias", {"5": 101}),
        ("min_p", 2),
        ("stop", ["x"] * 65),  # at most 64 stop strings
        ("stop", "x" * 1025),  # of at most 1024 characters each
        ("stop", ["ok", "y" * 1025]),
    ],
)
def test_out_of_range(http, field, value):
    body = {"model": TINY, "messages": MESSAGES, field: value, "logprobs": True}
    _error(http.post(CHAT, json=body), 400, field, field)


def test_values_the_engine_refuses_name_their_field(http):
    body = {"model": TINY, "messages": MESSAGES}
    _error(http.post(CHAT, json=body | {"logit_bias": {"x": 1}}), 400, "logit_bias", "x")
    _error(http.post(CHAT, json=body | {"logit_bias": {"99999": 1}}), 400, "logit_bias")
    _error(http.post(CHAT, json=body | {"stop": [""]}), 400, "stop", "empty")
    _error(http.post(CHAT, json=body | {"stop_token_ids": [100000]}), 400, "stop_token_ids")
    _error(http.post(CHAT, json=body | {"top_logprobs": 2}), 400, "top_logprobs", "logprobs")
    _error(
        http.post(CHAT, json=body | {"stream_options": {"include_usage": True}}),
        400,
        "stream_options",
    )
    _error(http.post(CHAT, json={"model": TINY, "messages": []}), 400, "messages")
    prompt = {"model": TINY, "prompt": ""}
    _error(http.post(COMPLETIONS, json=prompt), 400, "prompt", "empty")
    _error(http.post(COMPLETIONS, json=prompt | {"prompt": [999999]}), 400, "prompt")
    _error(http.post(COMPLETIONS, json=prompt | {"prompt": [[1], [5000]]}), 400, "prompt", "5000")
    many = prompt | {"prompt": ["a"] * 513, "n": 2}  # at most 1024 sequences a request
    _error(http.post(COMPLETIONS, json=many), 400, "prompt", "1026 sequences")


def test_unknown_fields_are_refused_by_name(http):
    body = {"model": TINY, "messages": MESSAGES, "frobnicate": 1}
    _error(http.post(CHAT, json=body), 400, "frobnicate", "frobnicate: unknown field")
    nested = {"model": TINY, "messages": [{"role": "user", "content": "hi", "mood": "good"}]}
    _error(http.post(CHAT, json=nested), 400, "messages", "messages[0].mood")
    completion = {"model": TINY, "prompt": "x", "web_search_options": {}}
    _error(http.post(COMPLETIONS, json=completion), 400, "web_search_options")


def test_fields_we_cannot_honour_are_refused_by_name(http):
    body = {"model": TINY, "messages": MESSAGES}
    cases = [
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"audio": {"format": "wav", "voice": "alloy"}}, "audio"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"store": True}, "store"),
    ]
    for extra, param in cases:
        _error(http.post(CHAT, json=body | extra), 400, param, param)
    image = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]
    with_image = {"model": TINY, "messages": [{"role": "user", "content": image}]}
    _error(http.post(CHAT, json=with_image), 400, "messages", "image_url")
    completion = {"model": TINY, "prompt": "x"}
    _error(http.post(COMPLETIONS, json=completion | {"suffix": "y"}), 400, "suffix")
    _error(http.post(COMPLETIONS, json=completion | {"best_of": 3}), 400, "best_of")


def test_unknown_model_is_404(client, http):
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert info.value.body["param"] == "model" and "gpt-4o" in info.value.body["message"]
    error = http.post(COMPLETIONS, json={"model": "nope", "prompt": "x"}).json()["error"]
    assert error["code"] == "model_not_found"
    assert http.get("/v1/models/nope").status_code == 404


def test_prompt_over_the_context_is_400(client, server):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=TINY, prompt="x" * 300)
    assert (
        info.value.body["param"] == "prompt" and "max_model_len=256" in info.value.body["message"]
    )
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=TINY, messages=[{"role": "user", "content": "x" * 300}]
        )
    assert info.value.body["param"] == "messages"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=TINY, messages=MESSAGES, max_completion_tokens=1000)
    assert info.value.body["param"] == "max_completion_tokens"
    assert "context length of 256" in info.value.body["message"]
    # the default max_tokens of completions shrinks to what fits instead
    out = client.completions.create(model=TINY, prompt="x" * 250, extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 6 and out.choices[0].finish_reason == "length"
    server.wait_idle()


def test_routes_and_methods(http):
    error = http.get("/v1/nothing-here").json()["error"]
    assert error["message"] == "Not Found"
    assert http.get(CHAT).status_code == 405
    assert "error" in http.get(CHAT).json()


def test_text_that_is_no_unicode_is_400_not_500(http):
    """JSON may escape lone surrogates ("\\ud800"); no tokenizer or UTF-8 encoder takes them."""
    cases = [
        (COMPLETIONS, b'{"model": "tiny", "prompt": "a\\ud800"}', "prompt"),
        (COMPLETIONS, b'{"model": "\\udc00", "prompt": "a"}', "model"),
        (COMPLETIONS, b'{"model": "tiny", "prompt": "a", "stop": ["\\ud800"]}', "stop"),
        (
            CHAT,
            b'{"model": "tiny", "messages": [{"role": "user", "content": "\\ud800"}]}',
            "messages",
        ),
        (CHAT, b'{"model": "tiny", "messages": [], "\\ud800": 1}', None),
    ]
    for path, body, param in cases:
        _error(http.post(path, content=body, headers=_json()), 400, param, "not valid Unicode")
    emoji = b'{"model": "tiny", "prompt": "\\ud83d\\ude00", "max_tokens": 2}'  # a proper pair
    assert http.post(COMPLETIONS, content=emoji, headers=_json()).status_code == 200


def test_integral_floats_are_integers_but_strings_are_not(http):
    body = {"model": TINY, "prompt": "a", "n": 2.0, "max_tokens": 2.0}
    assert len(http.post(COMPLETIONS, json=body).json()["choices"]) == 2
    _error(http.post(COMPLETIONS, json=body | {"n": "2"}), 400, "n", "valid integer")
    _error(http.post(COMPLETIONS, json=body | {"n": 2.5}), 400, "n", "valid integer")


def test_an_error_inside_a_stream_carries_type_param_and_code():
    """The stream's 200 is already sent: the event says what the status would have been."""
    from omnistage.entrypoints.openai.errors import OpenAIError
    from omnistage.entrypoints.openai.serving import stream_error

    def event(exc: Exception) -> dict:
        line = stream_error(exc).strip()
        assert line.startswith("data: ")
        return json.loads(line.removeprefix("data: "))["error"]

    bad = event(OpenAIError("messages: empty", 400, param="messages"))
    assert bad == {
        "message": "messages: empty",
        "type": "invalid_request_error",
        "param": "messages",
        "code": 400,
    }
    named = event(OpenAIError("no key", 401, code="invalid_api_key"))
    assert named["code"] == "invalid_api_key"
    ours = event(RuntimeError("the engine stopped"))
    assert ours["type"] == "server_error" and ours["code"] == 503 and ours["param"] is None


def test_no_answer_shows_a_memory_address_or_a_traceback():
    """Whatever an exception's message carries (an object's default repr, a worker's
    traceback), the answer carries neither; the full text is logged (issue 22)."""
    import traceback

    from omnistage.entrypoints.openai.errors import OpenAIError, error_response
    from omnistage.entrypoints.openai.serving import stream_error

    def failing() -> None:
        raise RuntimeError(f"boom in {failing!r}")

    try:
        failing()
    except RuntimeError:
        trace = traceback.format_exc()
    holder = object()
    answers = [
        OpenAIError.from_value_error(ValueError(f"prompt: cannot use {holder!r}")).response(),
        error_response(f"the engine failed: RunnerFailed: worker failed:\n{trace}", 503),
    ]
    bodies = [answer.body.decode() for answer in answers]
    bodies.append(stream_error(RuntimeError(f"stage 'thinker': {trace}")))
    for body in bodies:
        assert not SERVER_INSIDES.search(body), body
    assert "prompt: cannot use <object object>" in bodies[0]
    assert json.loads(bodies[0])["error"]["param"] == "prompt"
    for body in bodies[1:]:  # what came before the trace, and the exception it ended in
        assert "failed" in body or "thinker" in body
        assert "RuntimeError: boom in <function" in body and "server log" in body
    sizes = "size: expected 'WIDTHxHEIGHT', got '0x64' (9000x9000)"  # user text stays
    assert json.loads(error_response(sizes, 400).body)["error"]["message"] == sizes
