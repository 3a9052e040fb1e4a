"""`render_request_chat`: a request's chat messages as the prompt its model reads, the one
function every frontend renders with (the offline prompt reader, `pipeline.prompt_inputs`;
the server's text-model and pipeline clients), so `chat_template_kwargs` are checked and
passed to the template in one place.

`chat_template_kwargs` are vLLM's: extra variables of the chat template (HunyuanImage-3's
`bot_task`, a reasoning model's `enable_thinking`). Not an object of names, or a name the
render itself takes (`add_generation_prompt`, `tools`, ...), is a ValueError naming
`chat_template_kwargs`; a value the template refuses (its `raise_exception`) a ValueError
with the template's message (HunyuanImage-3's names `bot_task`).

The model is one of three kinds:

- it renders its own prompt (`own_prompt`: Bagel, GLM-Image): the last user message's
  text and every message's media, in order; it has no template to pass the kwargs to;
- a checkpoint that takes media (`config`: its path or config): its template renders one
  placeholder per audio / image part (`registry.render_model_chat`);
- a text model (no `config`): each message's text parts joined into one string (a text
  model's template reads a string); its other keys (`name`) are kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from jinja2 import TemplateError

from omnistage.multimodal.chat import LastUserText, render_chat
from omnistage.multimodal.prompts import ChatPrompt

RESERVED = frozenset(
    {
        "conversation",
        "messages",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "return_dict",
        "chat_template",
        "tools",
        "documents",
    }
)
"""What `apply_chat_template` itself takes: not a template variable a request may set."""


def check_template_kwargs(value: Any) -> dict[str, Any] | None:
    """The request's `chat_template_kwargs` (None: none); ValueError naming the field for
    anything but an object of names to values, or a reserved name."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ValueError("chat_template_kwargs: expected a dict of names to values")
    reserved = sorted(set(value) & RESERVED)
    if reserved:
        raise ValueError(
            f"chat_template_kwargs: {reserved[0]!r} is an argument of the render itself, "
            "not a template variable"
        )
    return dict(value)


def render_request_chat(
    tokenizer: Any,
    messages: list[Mapping[str, Any]],
    *,
    chat_template_kwargs: Any = None,
    own_prompt: bool = False,
    config: Any = None,
    supported: Iterable[str] = (),
) -> ChatPrompt:
    """`messages` (and `chat_template_kwargs`) rendered for the model (see the module
    docstring); `supported`: the media it takes. ValueError naming the field for what it
    cannot take; a template that fails on them is "messages: the chat template refused
    them"."""
    kwargs = check_template_kwargs(chat_template_kwargs)
    supported = frozenset(supported)
    try:
        if own_prompt:
            return render_chat(LastUserText(), list(messages), supported=supported)
        if config is None:
            return ChatPrompt(prompt=_render_text_chat(tokenizer, messages, kwargs))
        from omnistage.multimodal.registry import render_model_chat

        return render_model_chat(
            config, tokenizer, list(messages), chat_template_kwargs=kwargs, supported=supported
        )
    except TemplateError as exc:
        raise ValueError(f"messages: the chat template refused them: {exc}") from None


def _render_text_chat(
    tokenizer: Any, messages: Iterable[Mapping[str, Any]], kwargs: Mapping[str, Any] | None
) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("messages: this model has no chat template; send a completion prompt")
    conversation = []
    for message in messages:
        content = message["content"]
        if not isinstance(content, str):
            content = "".join(part["text"] for part in content)
        conversation.append({**message, "content": content})
    return tokenizer.apply_chat_template(
        conversation, tokenize=False, add_generation_prompt=True, **dict(kwargs or {})
    )
