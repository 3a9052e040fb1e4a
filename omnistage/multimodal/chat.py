"""Rendering OpenAI-style chat messages with audio / image content parts: the model's chat
template renders one placeholder per media item, and the media sources are collected in
placeholder order (`render_chat` -> `ChatPrompt`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from jinja2.exceptions import TemplateError

from omnistage.multimodal.media import resolve_url
from omnistage.multimodal.modalities import MODALITIES
from omnistage.multimodal.prompts import ChatPrompt


def _part_modality(part: Mapping[str, Any]) -> str:
    kind = part.get("type")
    if kind in ("audio", "input_audio", "audio_url") or (
        kind is None and any(k in part for k in ("audio", "input_audio", "audio_url"))
    ):
        return "audio"
    if kind in ("image", "image_url") or (
        kind is None and any(k in part for k in ("image", "image_url"))
    ):
        return "image"
    if kind in ("video", "video_url") or (kind is None and "video" in part):
        return "video"
    if kind == "text" or (kind is None and "text" in part):
        return "text"
    raise ValueError(f"messages: unknown content part type {kind!r}")


def _url_of(value: Any, what: str) -> Any:
    if isinstance(value, Mapping):
        value = value.get("url")
    if not isinstance(value, str):
        raise ValueError(f"{what}: expected a URL string or {{'url': ...}}")
    return resolve_url(value)


def _audio_source(part: Mapping[str, Any]) -> Any:
    if "input_audio" in part:
        spec = part["input_audio"]
        if not isinstance(spec, Mapping) or not isinstance(spec.get("data"), str):
            raise ValueError("input_audio: expected {'data': <base64>, 'format': ...}")
        from omnistage.multimodal.media import check_media_type, decode_data_url

        data = decode_data_url("data:audio;base64," + spec["data"])
        declared = spec.get("format")
        if isinstance(declared, str) and declared:
            check_media_type(data, f"audio/{declared.lower()}", "input_audio.format")
        return data
    if "audio_url" in part:
        return _url_of(part["audio_url"], "audio_url")
    if "audio" not in part:
        raise ValueError("audio: content part has no 'audio'")
    value = part["audio"]
    rate = part.get("sampling_rate", part.get("sample_rate"))
    if isinstance(value, str) and value.startswith(("data:", "file://")):
        return resolve_url(value)
    if rate is not None:
        return (value, rate)
    if isinstance(value, (np.ndarray, torch.Tensor)):
        raise ValueError("audio: an array of samples needs 'sampling_rate' in its content part")
    return value


def _image_source(part: Mapping[str, Any]) -> Any:
    if "image_url" in part:
        return _url_of(part["image_url"], "image_url")
    if "image" not in part:
        raise ValueError("image: content part has no 'image'")
    value = part["image"]
    if isinstance(value, str) and (value.startswith("data:") or "://" in value):
        return resolve_url(value)
    return value


def render_chat(
    tokenizer: Any,
    messages: list[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    supported: Iterable[str] = MODALITIES,
    placeholders: Mapping[str, str] | None = None,
) -> ChatPrompt:
    """Render messages with `tokenizer`'s chat template: one placeholder per audio / image
    content part; returns the prompt and the media sources in placeholder order.

    `placeholders` (`{"audio": ..., "image": ...}`, `MediaTokens.placeholders()`): what the
    template must render per item; the count of each is checked against the parts."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("messages: this model has no chat template")
    if not isinstance(messages, list) or not all(
        isinstance(m, Mapping) and "role" in m and "content" in m for m in messages
    ):
        raise ValueError("messages: expected a list of {'role': ..., 'content': ...} dicts")
    supported = frozenset(supported)
    audios: list[Any] = []
    images: list[Any] = []
    rendered = [_render_message(m, supported, audios, images) for m in messages]
    try:
        prompt = tokenizer.apply_chat_template(
            rendered,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **dict(chat_template_kwargs or {}),
        )
    except TemplateError as exc:
        if type(exc) is not TemplateError:  # a broken template, not the request's input
            raise
        raise ValueError(str(exc)) from None  # the template's own `raise_exception`
    _check_placeholders(prompt, placeholders or {}, audios, images)
    return ChatPrompt(prompt=prompt, audios=audios, images=images)


def _render_message(
    message: Mapping[str, Any], supported: frozenset[str], audios: list[Any], images: list[Any]
) -> dict[str, Any]:
    """One message as the template takes it: each audio / image part becomes a numbered
    placeholder part, its source appended to `audios` / `images`."""
    content = message["content"]
    if isinstance(content, str):
        return {"role": message["role"], "content": content}
    if not isinstance(content, list) or not all(isinstance(p, Mapping) for p in content):
        raise ValueError("messages: content must be a string or a list of content parts")
    parts = []
    for part in content:
        modality = _part_modality(part)
        if modality == "video":
            raise ValueError("video: video input is not supported")
        if modality != "text" and modality not in supported:
            raise ValueError(f"{modality}: this model does not accept {modality} input")
        if modality == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise ValueError("messages: a text content part needs a string 'text'")
            parts.append({"type": "text", "text": text})
        elif modality == "audio":
            audios.append(_audio_source(part))
            parts.append({"type": "audio", "audio": f"<audio {len(audios) - 1}>"})
        else:
            images.append(_image_source(part))
            parts.append({"type": "image", "image": f"<image {len(images) - 1}>"})
    return {"role": message["role"], "content": parts}


def _check_placeholders(
    prompt: str, placeholders: Mapping[str, str], audios: list[Any], images: list[Any]
) -> None:
    """The template rendered one placeholder per audio / image part (where it names one)."""
    for name, items in (("audio", audios), ("image", images)):
        placeholder = placeholders.get(name)
        if placeholder is None:
            continue
        if prompt.count(placeholder) != len(items):
            raise ValueError(
                f"messages: the chat template rendered {prompt.count(placeholder)} {name} "
                f"placeholder(s) for {len(items)} {name} part(s)"
            )


class LastUserText:
    """The chat "template" of a model that renders its own prompt (Bagel): the text parts
    of the last user message, joined by newlines; `render_chat(LastUserText(), …)` still
    collects every message's media in order."""

    chat_template = "last user message's text"

    def apply_chat_template(self, messages: list[Mapping[str, Any]], **_: Any) -> str:
        users = [m for m in messages if m["role"] == "user"]
        if not users:
            raise ValueError("messages: no user message")
        content = users[-1]["content"]
        if isinstance(content, str):
            return content
        return "\n".join(p["text"] for p in content if p.get("type") == "text")
