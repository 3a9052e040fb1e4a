"""Render a chat template as transformers does, without importing transformers.

The Jinja environment is set up as transformers' `_compile_jinja_template` sets
its own (sandboxed, `trim_blocks`/`lstrip_blocks`, loop controls, a `tojson`
that does not escape HTML, `raise_exception`, `strftime_now`, the
`{% generation %}` tag as a plain block), and a chat goes in as
`render_jinja_template` passes it (keys whose value is None dropped, reasoning
under its older names aliased, the tokenizer's named special tokens and the
caller's keyword arguments visible to the template). Only plain JSON-like chats
are rendered here (`is_plain`); anything else goes to transformers (see
`TextTokenizer.apply_chat_template`). Tests compare the two on every template
the test suite ships.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
"""Names a message's reasoning comes under; the first is the one templates read."""


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}…{% endgeneration %}`: rendered as its body (transformers uses it
    to find the assistant's tokens, which a frontend never asks for)."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _Namespace(jinja2.utils.Namespace):
    """`namespace(...)` refusing underscore names (no reach into Python internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes on a namespace "
                f"({name!r})"
            )


class _DictBuilder:
    """`dict(...)` in a template, without the type's own attributes."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


@functools.lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _DictBuilder()
    env.globals["namespace"] = _Namespace
    return env.from_string(source)


def is_plain(value: Any) -> bool:
    """Whether `value` is built only of JSON types (exact str/int/float/bool/None, dicts
    with string keys, lists): what this module renders; anything else is transformers'."""
    if value is None or type(value) in (str, int, float, bool):
        return True
    if type(value) is dict:
        return all(type(k) is str and is_plain(v) for k, v in value.items())
    if type(value) is list:
        return all(is_plain(v) for v in value)
    return False


def render_chat(
    source: str,
    messages: list[dict[str, Any]],
    special_tokens: dict[str, str],
    tools: list[dict[str, Any]] | None = None,
    documents: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    **kwargs: Any,
) -> str:
    """The rendered chat, as transformers' `apply_chat_template(..., tokenize=False)`."""
    chat = [_aliased({k: v for k, v in m.items() if v is not None}) for m in messages]
    return compile_template(source).render(
        messages=chat,
        tools=tools,
        documents=documents,
        add_generation_prompt=add_generation_prompt,
        **{**special_tokens, **kwargs},
    )


def _aliased(message: dict[str, Any]) -> dict[str, Any]:
    """`reasoning_content` (and `thinking`) filled from whichever reasoning name is set."""
    reasoning = next(
        (message[key] for key in _REASONING_FIELDS if message.get(key) is not None), None
    )
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}
