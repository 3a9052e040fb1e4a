"""POST /v1/chat/completions: messages through the chat template, text out.

Whole responses, or (`stream`) server-sent chunks: a first one per choice with
the role, then the text as it is generated (with its logprobs), the finish reason
on each choice's last chunk, with `stream_options.include_usage` a last chunk
with the usage, and `data: [DONE]`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from jinja2 import TemplateError

from omnistage.entrypoints.openai.deltas import TokenLogprob
from omnistage.entrypoints.openai.engine_client import EngineDeadError, RequestStream
from omnistage.entrypoints.openai.errors import OpenAIError
from omnistage.entrypoints.openai.protocol import (
    ChatChoice,
    ChatChoiceLogprobs,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatMessage,
    ChatResponseMessage,
    TextPart,
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


def add_chat_route(router: APIRouter, endpoint: Any) -> None:
    """`POST /v1/chat/completions` answered by `endpoint` (text models and pipelines)."""
    router.add_api_route(
        "/v1/chat/completions",
        endpoint,
        methods=["POST"],
        response_model=None,
        responses={200: {"model": ChatCompletionResponse}, **ERROR_RESPONSES},
    )


class ChatServing(OpenAIServing):
    def register(self, router: APIRouter) -> None:
        add_chat_route(router, self.create)

    async def create(self, body: ChatCompletionRequest, raw: Request) -> Response:
        self.check_model(body.model)
        self.check_stream_options(body)
        self.check_supported(body)
        explicit = "max_completion_tokens" if body.max_completion_tokens is not None else None
        renames = {"prompt": "messages", "max_tokens": explicit or "max_tokens"}
        max_tokens = body.max_completion_tokens or body.max_tokens
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        params = self.sampling_params(body, max_tokens, logprobs, renames)
        prompt = self.render(body.messages)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        stream = await self.add_request(
            prompt, params, request_id, renames, add_special_tokens=False
        )
        if body.stream:
            return EventStream(self.events(body, stream))
        response = await until_disconnect(raw, self.collect(body, stream))
        return JSONResponse(response.model_dump())

    def check_supported(self, body: ChatCompletionRequest) -> None:
        """400 for what this model cannot do (speech, images and tools come with their
        pipelines and parsers)."""
        if body.top_logprobs is not None and not body.logprobs:
            raise OpenAIError("top_logprobs: requires logprobs to be true", param="top_logprobs")
        if body.modalities is not None and set(body.modalities) != {"text"}:
            raise OpenAIError(
                "modalities: this model only produces text (use ['text'])", param="modalities"
            )
        if body.audio is not None:
            raise OpenAIError("audio: this model does not produce audio", param="audio")
        check_chat_extras(body)

    def render(self, messages: list[ChatMessage]) -> str:
        """The prompt text: messages through the model's chat template."""
        tokenizer = self.ctx.client.tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise OpenAIError(
                "messages: this model has no chat template; use /v1/completions", param="messages"
            )
        conversation = []
        for i, message in enumerate(messages):
            entry: dict[str, Any] = {
                "role": "system" if message.role == "developer" else message.role,
                "content": self._text(i, message),
            }
            if message.name is not None:
                entry["name"] = message.name
            conversation.append(entry)
        try:
            return tokenizer.apply_chat_template(
                conversation, tokenize=False, add_generation_prompt=True
            )
        except TemplateError as exc:
            raise OpenAIError(
                f"messages: the chat template refused them: {exc}", param="messages"
            ) from None

    @staticmethod
    def _text(i: int, message: ChatMessage) -> str:
        if message.content is None or isinstance(message.content, str):
            return message.content or ""
        texts = []
        for j, part in enumerate(message.content):
            if not isinstance(part, TextPart):
                raise OpenAIError(
                    f"messages[{i}].content[{j}]: {part.type} input is not supported by this model",
                    param="messages",
                )
            texts.append(part.text)
        return "".join(texts)

    async def collect(
        self, body: ChatCompletionRequest, stream: RequestStream
    ) -> ChatCompletionResponse:
        texts = [""] * body.n
        logprobs: list[list[TokenLogprobInfo]] = [[] for _ in range(body.n)]
        finish: list[tuple[str | None, int | str | None]] = [(None, None)] * body.n
        generated = cached = 0
        async with stream:
            async for delta in stream:
                check_not_aborted(delta)
                cached = delta.num_cached_tokens
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
        return ChatCompletionResponse(
            id=stream.request_id,
            created=int(time.time()),
            model=body.model,
            choices=choices,
            usage=usage(len(stream.prompt_token_ids), generated, cached),
        )

    async def events(
        self, body: ChatCompletionRequest, stream: RequestStream
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
        async with stream:
            for i in range(body.n):
                yield chunk(
                    [ChatChunkChoice(index=i, delta=ChatDelta(role="assistant", content=""))]
                )
            try:
                async for delta in stream:
                    check_not_aborted(delta)
                    cached = delta.num_cached_tokens
                    for seq in delta.sequences:
                        generated += len(seq.token_ids)
                        lps = _logprob_infos(seq.logprobs) if seq.logprobs is not None else None
                        choice = ChatChunkChoice(
                            index=seq.index,
                            delta=ChatDelta(content=seq.text),
                            logprobs=ChatChoiceLogprobs(content=lps) if body.logprobs else None,
                            finish_reason=seq.finish_reason,
                        )
                        yield chunk([choice])
            except (OpenAIError, EngineDeadError) as exc:
                yield stream_error(exc)
                yield DONE
                return
        if body.stream_options is not None and body.stream_options.include_usage:
            yield chunk([], usage=usage(len(stream.prompt_token_ids), generated, cached))
        yield DONE


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
