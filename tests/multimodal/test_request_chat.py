"""`render_request_chat`, the one chat render of every frontend: `chat_template_kwargs`
reach the template of a text model and of a checkpoint that takes media, are checked
(an object of names, none the render itself takes) even where the model renders its own
prompt, and the server's text-model client renders through it; `read_extra_args` refuses
every option of a model that declares none, naming it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from omnistage.entrypoints.openai.engine_client import AsyncEngineClient
from omnistage.entrypoints.openai.errors import OpenAIError
from omnistage.entrypoints.openai.model_options import read_extra_args
from omnistage.models.tiny_checkpoints import CHAT_TEMPLATE, byte_tokenizer
from omnistage.multimodal.request_chat import render_request_chat

GREETING = "{% if greeting is defined %}{{ greeting }}{% endif %}"
MESSAGES = [{"role": "user", "content": [{"type": "text", "text": "hi"}], "name": "ann"}]


@pytest.fixture(scope="module")
def tokenizer():
    tok = byte_tokenizer()
    tok.chat_template = GREETING + CHAT_TEMPLATE
    return tok


def test_text_model_chat_gets_the_kwargs_and_a_string_content(tokenizer) -> None:
    plain = render_request_chat(tokenizer, MESSAGES).prompt
    assert plain == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    greeted = render_request_chat(tokenizer, MESSAGES, chat_template_kwargs={"greeting": "yo"})
    assert greeted.prompt == "yo" + plain


def test_the_server_text_client_renders_through_it(tokenizer) -> None:
    client = AsyncEngineClient.__new__(AsyncEngineClient)
    client.engine = SimpleNamespace(tokenizer=tokenizer)
    chat = client.render_chat(MESSAGES, {"greeting": "yo"})
    assert (
        chat.prompt
        == render_request_chat(tokenizer, MESSAGES, chat_template_kwargs={"greeting": "yo"}).prompt
    )


@pytest.mark.parametrize("own_prompt", [False, True])
@pytest.mark.parametrize(
    ("kwargs", "says"),
    [(["greeting"], "expected a dict"), ({"tokenize": True}, "'tokenize'"), ({1: 2}, "dict")],
)
def test_bad_kwargs_name_the_field(tokenizer, own_prompt, kwargs, says) -> None:
    with pytest.raises(ValueError, match=f"^chat_template_kwargs: .*{says}"):
        render_request_chat(tokenizer, MESSAGES, chat_template_kwargs=kwargs, own_prompt=own_prompt)


def test_own_prompt_is_the_last_user_text(tokenizer) -> None:
    chat = render_request_chat(None, MESSAGES, chat_template_kwargs={"a": 1}, own_prompt=True)
    assert chat.prompt == "hi"


def test_a_broken_template_names_messages() -> None:
    tok = byte_tokenizer()
    tok.chat_template = "{{ messages[0]['content'] | nosuchfilter }}"
    with pytest.raises(ValueError, match="^messages: the chat template refused them"):
        render_request_chat(tok, MESSAGES)


def test_a_model_without_options_refuses_each_by_name() -> None:
    with pytest.raises(OpenAIError) as exc:
        read_extra_args({"think": True}, SimpleNamespace())
    assert exc.value.param == "think" and "no per-request options" in str(exc.value)
    assert read_extra_args(None, SimpleNamespace()).entry == {}
    with pytest.raises(OpenAIError) as exc:
        read_extra_args([1], SimpleNamespace())
    assert exc.value.param == "extra_args"
