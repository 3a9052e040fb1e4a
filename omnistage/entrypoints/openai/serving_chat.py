"""POST /v1/chat/completions, for every model: messages through the chat template; text,
audio where the model speaks, and the image where it draws, out.

    {"model": "demo-omni", "messages": [...], "modalities": ["text", "audio"],
     "audio": {"format": "wav", "voice": "ethan"}}

One handler serves a text model and a pipeline alike (`client.EngineClient`); what
a model cannot do is a 400 naming the field (`chat_request.plan_chat`). Messages:
text, and audio (`{"type": "input_audio", ...}`) / image (`{"type": "image_url",
...}`, base64 `data:` URLs) parts where the model takes them, rendered by the
client (`render_chat`: the model's chat template, with vLLM's `chat_template_kwargs`,
e.g. HunyuanImage-3's `{"bot_task": "recaption"}`; a pipeline's prompt reader places
the media). The model's own options (`extra_args`, vLLM-Omni's: Bagel's `think`,
`cfg_img_scale`, ...) go to the stages that read them (`model_options.py`). Sampling fields go over the client's defaults (a pipeline's entry-stage
deploy defaults, e.g. greedy with 32 tokens on demo-omni); `seed` seeds every
sampling stage. The prompt must leave room in the context for one token, and for
`max_tokens` / `max_completion_tokens` when given (else a 400 naming `messages` or
that field); without them a text model generates until the context ends.

Answers: whole responses, or (`stream`) server-sent chunks: a first one per choice
with the role, then the text as it is generated (with its logprobs where asked),
the audio as `delta.audio.data` (base64 pcm16 chunks, `id` on the first) as the
vocoder's chunks arrive, the finish reason on each choice's last chunk (with the
audio's `id`, `transcript` and `expires_at`), with `stream_options.include_usage` a
last chunk with the usage, and `data: [DONE]`. A whole response's audio is
`message.audio` = {id, data: base64 of the whole file, expires_at, transcript}. With
`image` in `modalities` the drawn picture comes as `message.images` (streamed: one chunk
with `delta.images` once it is drawn, before the finish reason; `chat_image`).
`usage.prompt_tokens` are the tokens the model receives (a pipeline's audio / image
parts as the stage's encoders expand them: the stage reports its prompt's length);
completion tokens are the text's. A client that disconnects aborts the
request (in every stage).
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from collections.abc import AsyncIterator
from http import HTTPStatus
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from omnistage.entrypoints.openai.chat_image import chat_image
from omnistage.entrypoints.openai.chat_request import ChatPlan, chat_messages, plan_chat
from omnistage.entrypoints.openai.client import DeltaStream, EngineDeadError
from omnistage.entrypoints.openai.deltas import TokenLogprob
from omnistage.entrypoints.openai.errors import OpenAIError
from omnistage.entrypoints.openai.protocol import (
    ChatAudio,
    ChatAudioDelta,
    ChatChoice,
    ChatChoiceLogprobs,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatImage,
    ChatResponseMessage,
    TokenLogprobInfo,
    TopLogprob,
)
from omnistage.entrypoints.openai.serving import (
    ERROR_RESPONSES,
    MIN_LOGPROB,
    OpenAIServing,
    check_not_aborted,
    stream_error,
    usage,
)
from omnistage.entrypoints.openai.sse import DONE, EventStream, sse, until_disconnect

AUDIO_EXPIRY_S = 3600
MEDIA_RENAMES = {"audio": "messages", "image": "messages"}
MEDIA_RENAMES |= {"input_audio": "messages", "image_url": "messages"}
"""The prompt reader's names for a message's media parts, as the request names them."""


class ChatServing(OpenAIServing):
    def register(self, router: APIRouter) -> None:
        router.add_api_route(
            "/v1/chat/completions",
            self.create,
            methods=["POST"],
            response_model=None,
            responses={200: {"model": ChatCompletionResponse}, **ERROR_RESPONSES},
        )

    async def create(self, body: ChatCompletionRequest, raw: Request) -> Response:
        self.check_model(body.model)
        self.check_stream_options(body)
        client = self.ctx.client
        plan = plan_chat(body, client)
        explicit = "max_completion_tokens" if body.max_completion_tokens is not None else None
        renames = {"prompt": "messages", **MEDIA_RENAMES, "max_tokens": explicit or "max_tokens"}
        renames |= {"height": "size", "width": "size"}
        max_tokens = body.max_completion_tokens or body.max_tokens
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        params = self.sampling_params(body, max_tokens, logprobs, renames, plan.model_options)
        messages = chat_messages(body.messages, client.input_modalities)
        try:
            chat = await asyncio.to_thread(client.render_chat, messages, body.chat_template_kwargs)
        except ValueError as exc:
            raise OpenAIError.from_value_error(exc, renames) from None
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        stream = await self.add_request(
            chat,
            params,
            request_id,
            renames,
            modalities=plan.modalities,
            voice=plan.voice,
            clamp_max_tokens=max_tokens is None,  # a default adapts to the room left
            **({"draw": plan.draw} if plan.draw is not None else {}),
        )
        if body.stream:
            return EventStream(self.events(body, plan, stream))
        response = await until_disconnect(raw, self.collect(body, plan, stream))
        return JSONResponse(response.model_dump())

    async def collect(
        self, body: ChatCompletionRequest, plan: ChatPlan, stream: DeltaStream
    ) -> ChatCompletionResponse:
        texts = [""] * body.n
        logprobs: list[list[TokenLogprobInfo]] = [[] for _ in range(body.n)]
        finish: list[tuple[str | None, int | str | None]] = [(None, None)] * body.n
        generated = cached = 0
        image = None
        async with stream:
            async for delta in stream:
                check_not_aborted(delta)
                cached = delta.num_cached_tokens
                image = image if delta.image is None else delta.image
                for seq in delta.sequences:
                    texts[seq.index] += seq.text
                    generated += len(seq.token_ids)
                    logprobs[seq.index] += _logprob_infos(seq.logprobs or [])
                    if seq.finish_reason is not None:
                        finish[seq.index] = (seq.finish_reason, seq.stop_reason)
        choices = [
            ChatChoice(
                index=i,
                message=ChatResponseMessage(content=texts[i]),
                logprobs=ChatChoiceLogprobs(content=logprobs[i]) if body.logprobs else None,
                finish_reason=finish[i][0],
                stop_reason=finish[i][1],
            )
            for i in range(body.n)
        ]
        if plan.audio_format is not None:
            choices[0].message.audio = await _whole_audio(stream, plan.audio_format, texts[0])
        if plan.draw is not None:
            choices[0].message.images = [await _chat_image(image)]
        return ChatCompletionResponse(
            id=stream.request_id,
            created=int(time.time()),
            model=body.model,
            choices=choices,
            usage=usage(stream.num_prompt_tokens, generated, cached),
        )

    async def events(
        self, body: ChatCompletionRequest, plan: ChatPlan, stream: DeltaStream
    ) -> AsyncIterator[str]:
        created = int(time.time())

        def chunk(choices: list[ChatChunkChoice], **kwargs: Any) -> str:
            return sse(
                ChatCompletionChunk(
                    id=stream.request_id,
                    created=created,
                    model=body.model,
                    choices=choices,
                    **kwargs,
                )
            )

        generated = cached = 0
        texts = [""] * body.n
        audio_id: str | None = None
        async with stream:
            for i in range(body.n):
                yield chunk(
                    [ChatChunkChoice(index=i, delta=ChatDelta(role="assistant", content=""))]
                )
            try:
                async for delta in stream:
                    check_not_aborted(delta)
                    cached = delta.num_cached_tokens
                    if delta.audio is not None:
                        audio = ChatAudioDelta(data=_pcm16_base64(delta.audio))
                        if audio_id is None:
                            audio_id = audio.id = f"audio-{uuid.uuid4().hex}"
                        yield chunk([ChatChunkChoice(index=0, delta=ChatDelta(audio=audio))])
                    if plan.draw is not None and delta.finished:
                        images = [await _chat_image(delta.image)]
                        yield chunk([ChatChunkChoice(index=0, delta=ChatDelta(images=images))])
                    for seq in delta.sequences:
                        generated += len(seq.token_ids)
                        texts[seq.index] += seq.text
                        lps = _logprob_infos(seq.logprobs) if seq.logprobs is not None else None
                        content = ChatDelta(content=seq.text)
                        if seq.finish_reason is not None and audio_id is not None:
                            content.audio = ChatAudioDelta(
                                id=audio_id,
                                transcript=texts[seq.index],
                                expires_at=int(time.time()) + AUDIO_EXPIRY_S,
                            )
                        choice = ChatChunkChoice(
                            index=seq.index,
                            delta=content,
                            logprobs=ChatChoiceLogprobs(content=lps) if body.logprobs else None,
                            finish_reason=seq.finish_reason,
                        )
                        yield chunk([choice])
            except (OpenAIError, EngineDeadError) as exc:
                yield stream_error(exc)
                yield DONE
                return
        if body.stream_options is not None and body.stream_options.include_usage:
            yield chunk([], usage=usage(stream.num_prompt_tokens, generated, cached))
        yield DONE


async def _whole_audio(stream: DeltaStream, audio_format: str, transcript: str) -> ChatAudio:
    """The answer's audio as one file (`audio_format`), base64, with its transcript."""
    from omnistage.entrypoints.openai.serving_speech import encode

    audio = stream.final_audio()
    if audio is None:
        raise OpenAIError("the pipeline produced no audio", HTTPStatus.INTERNAL_SERVER_ERROR)
    data = await asyncio.to_thread(encode, audio[0], audio[1], audio_format)
    return ChatAudio(
        id=f"audio-{uuid.uuid4().hex}",
        data=base64.b64encode(data).decode("ascii"),
        expires_at=int(time.time()) + AUDIO_EXPIRY_S,
        transcript=transcript,
    )


async def _chat_image(image: Any) -> ChatImage:
    if image is None:
        raise OpenAIError("the pipeline drew no image", HTTPStatus.INTERNAL_SERVER_ERROR)
    return await asyncio.to_thread(chat_image, image)


def _pcm16_base64(samples: Any) -> str:
    from omnistage.entrypoints.openai.serving_speech import pcm16_base64

    return pcm16_base64(samples)


def _logprob_infos(entries: list[TokenLogprob]) -> list[TokenLogprobInfo]:
    return [
        TokenLogprobInfo(
            token=e.token,
            logprob=max(e.logprob, MIN_LOGPROB),
            bytes=e.bytes,
            top_logprobs=[
                TopLogprob(token=t, bytes=b, logprob=max(lp, MIN_LOGPROB)) for t, b, lp in e.top
            ],
        )
        for e in entries
    ]
