"""POST /v1/chat/completions over a multi-stage pipeline (`demo-omni`, Qwen3-Omni, ...).

    {"model": "demo-omni", "messages": [...], "modalities": ["text", "audio"],
     "audio": {"format": "wav", "voice": "ethan"}}

Messages: text, and audio (`{"type": "input_audio", "input_audio": {"data": <base64>,
"format": "wav"}}`) / image (`{"type": "image_url", "image_url": {"url": "data:..."}}`)
parts where the pipeline's entry stage takes them (else a 400 naming the part; image
URLs must be base64 `data:` URLs). They are rendered with the entry model's chat template
by the pipeline's prompt reader.

`modalities`: `["text"]` (the default without `audio`; only the stages the text needs
run) or `["text", "audio"]` (the default with `audio`) where the pipeline speaks; what it
cannot produce is a 400 naming `modalities`. `audio.format`: wav or pcm16 ("pcm" too);
`audio.voice`: one of the model's voices, any case (as POST /v1/audio/speech; a 400
naming `audio.voice` with the choices otherwise); the talker speaks with it.

Sampling fields go to the entry (thinker) stage as `SamplingParams`, over the stage's
`default_sampling` (fields the request leaves out keep the deploy's defaults, e.g.
greedy with 32 tokens on demo-omni); `seed` seeds every sampling stage (the talker
too), so a seeded request is reproducible end to end. `n` > 1 and `logprobs` are 400s
(a pipeline generates one sequence and reports no logprobs).

Context: the thinker's prompt (the rendered chat, counted with its tokenizer) must
leave room for at least one token, and for `max_tokens` / `max_completion_tokens` when
given, within its `max_model_len`; else a 400 naming `messages` or that field.

Answers: `message.content` is the thinker's text; with audio, `message.audio` = {id,
data: base64 of the whole file, expires_at, transcript: the text}. `usage`:
`prompt_tokens` are the tokens the thinker receives for a text chat, exactly (its
tokenizer over the rendered chat); an audio / image part counts as its placeholder's
marker tokens only (the encoders expand it into many in the stage, which the frontend
does not run), so media prompts are undercounted. Completion tokens are the thinker's. With
`stream`: the text as `delta.content` as the thinker writes it, the audio as
`delta.audio.data` (base64 pcm16 chunks, `id` on the first) as the vocoder's chunks
arrive, the finish reason, the usage (`stream_options.include_usage`), `[DONE]`. A
client that disconnects aborts the request in every stage.
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from jinja2 import TemplateError

from omnistage.entrypoints.openai.errors import OpenAIError
from omnistage.entrypoints.openai.pipeline_client import PipelineClient
from omnistage.entrypoints.openai.protocol import (
    AudioPart,
    ChatAudio,
    ChatAudioDelta,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatMessage,
    ChatResponseMessage,
    ImagePart,
    SamplingFields,
    TextPart,
)
from omnistage.entrypoints.openai.serving import (
    OpenAIServing,
    ServingContext,
    stream_error,
    usage,
)
from omnistage.entrypoints.openai.serving_chat import add_chat_route, check_chat_extras
from omnistage.entrypoints.openai.serving_speech import _float32, encode, to_pcm16
from omnistage.entrypoints.openai.sse import DONE, EventStream, sse, until_disconnect
from omnistage.pipeline.outputs import OmniRequestOutput
from omnistage.sampling_params import SamplingParams

AUDIO_FORMATS = {"wav": "wav", "pcm16": "pcm", "pcm": "pcm"}
"""Served `audio.format` -> the encoding (serving_speech.encode)."""
AUDIO_EXPIRY_S = 3600
ENTRY_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "min_tokens",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "logit_bias",
    "skip_special_tokens",
    "include_stop_str_in_output",
)
"""Request fields that become the entry stage's SamplingParams fields of the same name."""


@dataclass
class _Plan:
    """What one request asks of the pipeline."""

    modalities: list[str]
    text_stage: str
    audio_stage: str | None
    audio_format: str | None
    voice: str | None = None
    """The talker's speaker (`PipelineClient.check_voice`; None: the model's default)."""
    arrival: float = field(default_factory=time.monotonic)


class PipelineChatServing(OpenAIServing):
    @classmethod
    def enabled(cls, ctx: ServingContext) -> bool:
        return isinstance(ctx.client, PipelineClient)

    @property
    def client(self) -> PipelineClient:
        return self.ctx.client  # type: ignore[return-value]

    def register(self, router: APIRouter) -> None:
        add_chat_route(router, self.create)

    async def create(self, body: ChatCompletionRequest, raw: Request) -> Response:
        self.check_model(body.model)
        self.check_stream_options(body)
        plan = self.plan(body)
        params = self.stage_params(body)
        messages = self.messages(body.messages)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        explicit = "max_completion_tokens" if body.max_completion_tokens is not None else None
        renames = {
            "prompt": "messages",
            "audio": "messages",
            "image": "messages",
            "input_audio": "messages",
            "image_url": "messages",
            "max_tokens": explicit or "max_tokens",
        }
        prompt, num_prompt = await asyncio.to_thread(self.render, messages, renames)
        check_context(
            self.client,
            num_prompt,
            body.max_completion_tokens or body.max_tokens,
            explicit or "max_tokens",
            "messages",
        )
        updates = self.client.generate(
            prompt, params, plan.modalities, request_id, renames, plan.voice
        )
        if body.stream:
            first = await anext(updates)  # 400s are raised here, before the response starts
            return EventStream(self.events(body, plan, request_id, first, updates, num_prompt))
        response = await until_disconnect(
            raw, self.collect(body, plan, request_id, updates, num_prompt)
        )
        return JSONResponse(response.model_dump())

    # -- checks ----------------------------------------------------------------------------
    def plan(self, body: ChatCompletionRequest) -> _Plan:
        """400 for what the pipeline cannot do; the modalities to run otherwise."""
        text = self.client.final_stage("text")
        if text is None:
            raise OpenAIError(
                "modalities: this multi-stage pipeline produces no text, so it answers no chat; "
                "it answers " + self.client.other_endpoints,
                param="modalities",
            )
        if body.n != 1:
            raise OpenAIError(
                "n: a multi-stage pipeline generates one sequence per request", param="n"
            )
        if body.logprobs or body.top_logprobs is not None:
            raise OpenAIError(
                "logprobs: a multi-stage pipeline does not report logprobs", param="logprobs"
            )
        check_chat_extras(body)
        if body.modalities is not None:
            modalities = list(dict.fromkeys(body.modalities))
        else:
            modalities = ["text", "audio"] if body.audio is not None else ["text"]
        produces = ["text"] + (["audio"] if self.client.speaks else [])
        if "audio" in modalities and not self.client.speaks:
            raise OpenAIError(
                "modalities: this pipeline cannot produce audio; it produces text only",
                param="modalities",
            )
        if "text" not in modalities:
            raise OpenAIError(
                f"modalities: must include 'text' (this pipeline produces {produces})",
                param="modalities",
            )
        audio_format = voice = None
        if "audio" in modalities:
            if body.audio is not None:
                fmt = AUDIO_FORMATS.get(body.audio.format)
                if fmt is None:
                    raise OpenAIError(
                        f"audio.format: {body.audio.format!r} is not served; use wav or pcm16",
                        param="audio.format",
                    )
                voice = self.client.check_voice(body.audio.voice, "audio.voice")
                audio_format = fmt
            else:
                audio_format = "wav"
        elif body.audio is not None:
            raise OpenAIError(
                "audio: audio output needs 'audio' in modalities (['text', 'audio'])",
                param="audio",
            )
        audio = self.client.final_stage("audio") if audio_format is not None else None
        return _Plan(modalities, text.name, audio and audio.name, audio_format, voice)

    def stage_params(self, body: ChatCompletionRequest) -> dict[str, SamplingParams]:
        explicit = "max_completion_tokens" if body.max_completion_tokens is not None else None
        max_tokens = body.max_completion_tokens or body.max_tokens
        return stage_params(self.client, body, max_tokens, explicit or "max_tokens")

    def messages(self, messages: list[ChatMessage]) -> list[dict[str, Any]]:
        """The messages as the prompt reader takes them; 400 naming a part the entry stage
        does not take."""
        accepted = self.client.omni._prompts.input_modalities
        takes = ", ".join(sorted(accepted)) or "text only"
        out = []
        for i, message in enumerate(messages):
            role = "system" if message.role == "developer" else message.role
            content: Any = message.content or ""
            if not isinstance(content, str):
                parts: list[dict[str, Any]] = []
                for j, part in enumerate(content):
                    where = f"messages[{i}].content[{j}]"
                    if isinstance(part, TextPart):
                        parts.append({"type": "text", "text": part.text})
                        continue
                    modality = "audio" if isinstance(part, AudioPart) else "image"
                    if modality not in accepted:
                        raise OpenAIError(
                            f"{where}: {part.type} parts are not accepted: this pipeline's entry "
                            f"stage takes {takes}",
                            param="messages",
                        )
                    if isinstance(part, AudioPart):
                        parts.append(
                            {"type": "input_audio", "input_audio": part.input_audio.model_dump()}
                        )
                    else:
                        assert isinstance(part, ImagePart)
                        if not part.image_url.url.startswith("data:"):
                            raise OpenAIError(
                                f"{where}: image_url must be a base64 data: URL "
                                "(data:image/png;base64,...)",
                                param="messages",
                            )
                        parts.append(
                            {"type": "image_url", "image_url": {"url": part.image_url.url}}
                        )
                content = parts
            out.append({"role": role, "content": content})
        return out

    def render(
        self, messages: list[dict[str, Any]], renames: dict[str, str]
    ) -> tuple[dict[str, Any], int]:
        """The pipeline prompt of `messages` (rendered with the entry model's chat template,
        as the prompt reader would: the text and its media in placeholder order) and the
        number of tokens the thinker receives for it (see `count_prompt_tokens`). Blocks."""
        from omnistage.multimodal.registry import render_model_chat

        reader = self.client.omni._prompts
        try:
            chat = render_model_chat(
                reader._path, self.client.tokenizer, messages, supported=reader.input_modalities
            )
        except ValueError as exc:
            raise OpenAIError.from_value_error(exc, renames) from None
        except TemplateError as exc:
            raise OpenAIError(
                f"messages: the chat template refused them: {exc}", param="messages"
            ) from None
        has_media = bool(chat.audios or chat.images)
        prompt: dict[str, Any] = {"prompt": chat.prompt}
        if has_media:
            prompt["multi_modal_data"] = {"audio": chat.audios, "image": chat.images}
        return prompt, self.client.count_prompt_tokens(chat.prompt, has_media)

    # -- answers ---------------------------------------------------------------------------
    def _first_audio(self, plan: _Plan) -> None:
        assert plan.audio_stage is not None
        self.ctx.metrics.on_first_audio(plan.audio_stage, time.monotonic() - plan.arrival)

    async def collect(
        self,
        body: ChatCompletionRequest,
        plan: _Plan,
        request_id: str,
        updates: AsyncIterator[OmniRequestOutput],
        num_prompt: int,
    ) -> ChatCompletionResponse:
        generated, seen_audio = 0, False
        try:
            output = await anext(updates)
            while True:
                if output.stage == plan.text_stage:
                    generated += len(output.new_token_ids)
                if (
                    not seen_audio
                    and plan.audio_stage is not None
                    and output.stage == plan.audio_stage
                    and output.new_data is not None
                ):
                    seen_audio = True
                    self._first_audio(plan)
                if output.finished:
                    break
                output = await anext(updates)
        finally:
            await updates.aclose()  # type: ignore[attr-defined]
        result = output.outputs.get(plan.text_stage)
        text = result.text if result is not None else (output.text or "")
        message = ChatResponseMessage(content=text)
        if plan.audio_format is not None:
            if output.audio is None or output.sample_rate is None:
                raise OpenAIError(
                    "the pipeline produced no audio", HTTPStatus.INTERNAL_SERVER_ERROR
                )
            if not seen_audio:
                self._first_audio(plan)
            data = await asyncio.to_thread(
                encode, output.audio, output.sample_rate, plan.audio_format
            )
            message.audio = ChatAudio(
                id=f"audio-{uuid.uuid4().hex}",
                data=base64.b64encode(data).decode("ascii"),
                expires_at=int(time.time()) + AUDIO_EXPIRY_S,
                transcript=text,
            )
        return ChatCompletionResponse(
            id=request_id,
            created=int(time.time()),
            model=body.model,
            choices=[
                ChatChoice(
                    index=0,
                    message=message,
                    finish_reason=result.finish_reason if result is not None else None,
                )
            ],
            usage=usage(num_prompt, generated),
        )

    async def events(
        self,
        body: ChatCompletionRequest,
        plan: _Plan,
        request_id: str,
        first: OmniRequestOutput,
        updates: AsyncIterator[OmniRequestOutput],
        num_prompt: int,
    ) -> AsyncIterator[str]:
        created = int(time.time())

        def chunk(choices: list[ChatChunkChoice], **kwargs: Any) -> str:
            return sse(
                ChatCompletionChunk(
                    id=request_id, created=created, model=body.model, choices=choices, **kwargs
                )
            )

        output, generated, audio_id = first, 0, None
        try:
            yield chunk([ChatChunkChoice(index=0, delta=ChatDelta(role="assistant", content=""))])
            while True:
                if output.stage == plan.text_stage:
                    generated += len(output.new_token_ids)
                    if output.new_text:
                        yield chunk(
                            [ChatChunkChoice(index=0, delta=ChatDelta(content=output.new_text))]
                        )
                if (
                    plan.audio_stage is not None
                    and output.stage == plan.audio_stage
                    and output.new_data is not None
                ):
                    pcm = to_pcm16(output.new_data.to(dtype=_float32()).numpy())
                    delta = ChatAudioDelta(data=base64.b64encode(pcm).decode("ascii"))
                    if audio_id is None:
                        self._first_audio(plan)
                        audio_id = delta.id = f"audio-{uuid.uuid4().hex}"
                    yield chunk([ChatChunkChoice(index=0, delta=ChatDelta(audio=delta))])
                if output.finished:
                    break
                try:
                    output = await anext(updates)
                except OpenAIError as exc:  # a shutdown or a failed stage
                    yield stream_error(exc)
                    yield DONE
                    return
        finally:
            await updates.aclose()  # type: ignore[attr-defined]
        result = output.outputs.get(plan.text_stage)
        final = ChatDelta()
        if audio_id is not None:
            final.audio = ChatAudioDelta(
                id=audio_id,
                transcript=result.text if result is not None else "",
                expires_at=int(time.time()) + AUDIO_EXPIRY_S,
            )
        reason = result.finish_reason if result is not None else "stop"
        yield chunk([ChatChunkChoice(index=0, delta=final, finish_reason=reason)])
        if body.stream_options is not None and body.stream_options.include_usage:
            yield chunk([], usage=usage(num_prompt, generated))
        yield DONE


def check_context(
    client: PipelineClient, num_prompt: int, max_tokens: int | None, param: str, prompt_param: str
) -> None:
    """400 when the thinker's prompt of `num_prompt` tokens leaves no room in its context,
    or less than `max_tokens` (the request's field `param`) when given."""
    limit = client.max_model_len
    if limit is None:
        return
    if num_prompt >= limit:
        raise OpenAIError(
            f"{prompt_param}: the prompt ({num_prompt} tokens) leaves no room to generate "
            f"within the context length of {limit} tokens",
            param=prompt_param,
        )
    room = limit - num_prompt
    if max_tokens is not None and max_tokens > room:
        raise OpenAIError(
            f"{param}: the prompt ({num_prompt} tokens) plus {param} ({max_tokens}) exceeds "
            f"the context length of {limit} tokens; at most {room} tokens can be generated",
            param=param,
        )


def stage_params(
    client: PipelineClient, body: SamplingFields, max_tokens: int | None, max_tokens_param: str
) -> dict[str, SamplingParams]:
    """The entry stage's SamplingParams (the request's fields over its defaults; `max_tokens`
    when not None), and with a seed, every other sampling stage's (its defaults, seeded).
    A bad value is a 400 naming the field (`max_tokens_param` for max_tokens)."""
    (entry,) = client.deploy.entry_stages
    given = body.model_fields_set
    fields = {f: getattr(body, f) for f in ENTRY_FIELDS if f in given}
    fields = {k: v for k, v in fields.items() if v is not None}
    if fields.get("logit_bias") is not None:
        fields["logit_bias"] = dict(fields["logit_bias"])
    if max_tokens is not None:
        fields["max_tokens"] = max_tokens
    params: dict[str, SamplingParams] = {}
    try:
        params[entry.name] = SamplingParams(**{**entry.default_sampling, **fields})
        if body.seed is not None:
            for stage in client.deploy.stages:
                if stage.name != entry.name and stage.kind != "diffusion":
                    seeded = {**stage.default_sampling, "seed": body.seed}
                    params[stage.name] = SamplingParams(**seeded)
    except (ValueError, TypeError) as exc:
        renames = {"max_tokens": max_tokens_param}
        raise OpenAIError.from_value_error(ValueError(str(exc)), renames) from None
    return params
