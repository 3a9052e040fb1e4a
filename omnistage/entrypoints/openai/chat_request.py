"""What a chat request asks of the model, checked against what its `EngineClient` can do.

`plan_chat` refuses with a 400 naming the field whatever the served model cannot
do, the same way for a text model and a pipeline (their differences are the
client's `produces`, `multiple_samples`, `reports_logprobs` and
`input_modalities`), and otherwise says which modalities to answer with:

- `modalities`: `["text"]` (the default without `audio`) or `["text", "audio"]` (the
  default with `audio`) where the model speaks; what it cannot produce is a 400
  naming `modalities`; `audio` given to a model that does not speak, a 400 naming
  `audio`.
- `audio.format`: wav or pcm16 ("pcm" too); `audio.voice`: one of the model's voices,
  any case (a 400 naming `audio.voice` with the choices otherwise).
- `modalities` with `image` where the model draws (`["text", "image"]`, or `["image"]`
  alone; the default of a model that draws but writes no text, GLM-Image): the image
  fields (`size`, `num_inference_steps`, `guidance_scale`, `negative_prompt`) become the
  draw stage's `DiffusionParams` with the request's `seed` (`chat_image.draw_params`);
  an image field without `image` in `modalities`, a 400 naming it.
- `extra_args` (`model_options.py`): the entry stage's options go with the sampling
  params, the draw stage's with the image's; a draw stage's option without `image` in
  `modalities`, a 400 naming it.
- `n` > 1 and `logprobs` where the model cannot (a pipeline generates one sequence and
  reports no logprobs); structured output, tools and `store`: never.

`chat_messages` turns the messages into the dicts a client's `render_chat` takes:
text, and audio / image parts where the model takes them (a 400 naming the part
otherwise; image URLs must be base64 `data:` URLs).
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, replace
from typing import Any

from omnistage.entrypoints.openai.chat_image import draw_params
from omnistage.entrypoints.openai.client import EngineClient
from omnistage.entrypoints.openai.errors import OpenAIError
from omnistage.entrypoints.openai.model_options import read_extra_args
from omnistage.entrypoints.openai.protocol import (
    AudioPart,
    ChatCompletionRequest,
    ChatMessage,
    TextPart,
)

AUDIO_FORMATS = {"wav": "wav", "pcm16": "pcm", "pcm": "pcm"}
"""Served `audio.format` -> the encoding (serving_speech.encode)."""


@dataclass(frozen=True)
class ChatPlan:
    """What one chat request asks of the model."""

    modalities: list[str]
    audio_format: str | None = None
    """The encoding of the answer's audio (None: no audio)."""
    voice: str | None = None
    """The talker's speaker (`check_voice`; None: the model's default)."""
    draw: Any = None
    """The draw stage's `DiffusionParams` when the answer has an image (None: no image)."""
    model_options: dict[str, Any] | None = None
    """The entry stage's `SamplingParams.model_options` (`extra_args` it reads)."""


def plan_chat(body: ChatCompletionRequest, client: EngineClient) -> ChatPlan:
    """400 for what the model cannot do; the modalities to answer with otherwise, and the
    request's `extra_args` split by the stage that reads each (`model_options`)."""
    options = read_extra_args(body.extra_args, client)
    plan = _plan(body, client, options.draw)
    return replace(plan, model_options=options.entry or None)


def _plan(body: ChatCompletionRequest, client: EngineClient, draw_options: dict) -> ChatPlan:
    if not client.produces:
        raise OpenAIError(
            "modalities: this multi-stage pipeline produces no text, so it answers no chat; "
            "it answers " + client.other_endpoints,
            param="modalities",
        )
    if body.n != 1 and not client.multiple_samples:
        raise OpenAIError("n: a multi-stage pipeline generates one sequence per request", param="n")
    if (body.logprobs or body.top_logprobs is not None) and not client.reports_logprobs:
        raise OpenAIError(
            "logprobs: a multi-stage pipeline does not report logprobs", param="logprobs"
        )
    if body.top_logprobs is not None and not body.logprobs:
        raise OpenAIError("top_logprobs: requires logprobs to be true", param="top_logprobs")
    check_chat_extras(body)
    speaks = "audio" in client.produces
    if body.audio is not None and not speaks:
        raise OpenAIError("audio: this model does not produce audio", param="audio")
    modalities = _modalities(body, client)
    if "audio" in modalities and not speaks:
        raise OpenAIError(
            f"modalities: this model cannot produce audio; it produces {list(client.produces)}",
            param="modalities",
        )
    if "text" not in modalities and modalities != ["image"]:
        raise OpenAIError(
            f"modalities: must include 'text' (this model produces {list(client.produces)})",
            param="modalities",
        )
    draw = draw_params(body, client, "image" in modalities, draw_options)
    if "audio" not in modalities:
        if body.audio is not None:
            raise OpenAIError(
                "audio: audio output needs 'audio' in modalities (['text', 'audio'])",
                param="audio",
            )
        return ChatPlan(modalities, draw=draw)
    if body.audio is None:
        return ChatPlan(modalities, "wav")
    audio_format = AUDIO_FORMATS.get(body.audio.format)
    if audio_format is None:
        raise OpenAIError(
            f"audio.format: {body.audio.format!r} is not served; use wav or pcm16",
            param="audio.format",
        )
    return ChatPlan(modalities, audio_format, client.check_voice(body.audio.voice, "audio.voice"))


def _modalities(body: ChatCompletionRequest, client: EngineClient) -> list[str]:
    """The requested modalities (each once), or the default: text (and audio with `audio`),
    or the image where the model writes no text; 400 naming `modalities` for an image
    from a model that does not draw."""
    if body.modalities is None:
        if "text" not in client.produces:
            return ["image"]
        return ["text", "audio"] if body.audio is not None else ["text"]
    modalities = list(dict.fromkeys(body.modalities))
    if "image" in modalities and "image" not in client.produces:
        raise OpenAIError(
            f"modalities: this model does not draw; it produces {list(client.produces)}",
            param="modalities",
        )
    if "text" in modalities and "text" not in client.produces:
        raise OpenAIError(
            f"modalities: this model writes no text; it produces {list(client.produces)}",
            param="modalities",
        )
    return modalities


def check_chat_extras(body: ChatCompletionRequest) -> None:
    """400 for the chat fields no model here honours (structured output, tools, store)."""
    if body.response_format is not None and body.response_format.type != "text":
        raise OpenAIError(
            f"response_format: {body.response_format.type} is not supported (only text)",
            param="response_format",
        )
    if body.tools:
        raise OpenAIError("tools: tool calling is not supported", param="tools")
    if body.tool_choice not in (None, "none", "auto"):
        raise OpenAIError(
            "tool_choice: tool calling is not supported (use none or auto)",
            param="tool_choice",
        )
    if body.store:
        raise OpenAIError("store: storing completions is not supported", param="store")


def chat_messages(messages: list[ChatMessage], accepted: Set[str]) -> list[dict[str, Any]]:
    """The messages as `render_chat` takes them ("developer" is "system"); a 400 naming a
    part whose modality is not in `accepted`."""
    takes = ", ".join(sorted(accepted)) or "text only"
    out = []
    for i, message in enumerate(messages):
        role = "system" if message.role == "developer" else message.role
        content: Any = message.content or ""
        if not isinstance(content, str):
            content = [
                _part(part, f"messages[{i}].content[{j}]", accepted, takes)
                for j, part in enumerate(content)
            ]
        entry: dict[str, Any] = {"role": role, "content": content}
        if message.name is not None:
            entry["name"] = message.name
        out.append(entry)
    return out


def _part(part: Any, where: str, accepted: Set[str], takes: str) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    modality = "audio" if isinstance(part, AudioPart) else "image"
    if modality not in accepted:
        raise OpenAIError(
            f"{where}: {part.type} parts are not accepted: this model takes {takes}",
            param="messages",
        )
    if isinstance(part, AudioPart):
        return {"type": "input_audio", "input_audio": part.input_audio.model_dump()}
    if not part.image_url.url.startswith("data:"):
        raise OpenAIError(
            f"{where}: image_url must be a base64 data: URL (data:image/png;base64,...)",
            param="messages",
        )
    return {"type": "image_url", "image_url": {"url": part.image_url.url}}
