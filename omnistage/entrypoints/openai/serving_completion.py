"""POST /v1/completions, for every model: a prompt (a string, token ids, or a list of
either) in, text out, with no chat template.

One handler serves a text model and a pipeline whose entry stage writes text (as
vLLM-Omni keeps vLLM's completions endpoint on an `AsyncOmni`: only the stages the
text needs run). Each prompt is one request with `n` samples; choice `i * n + j` is
sample `j` of prompt `i`, as OpenAI numbers them. Streamed chunks have the shape of
the whole response (`text_completion`), one choice each, then `data: [DONE]`.
`max_tokens` defaults to the client's default (a pipeline's entry-stage deploy
default), else OpenAI's 16, clamped to what fits each prompt's context; one given
explicitly that does not fit is a 400. What the model cannot do (`n` > 1 and
`logprobs` on a pipeline; `suffix`, `best_of` other than `n`, `echo` with `logprobs`)
is a 400 naming the field; a pipeline that writes no text answers a 400 naming the
endpoints it does answer.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from omnistage.entrypoints.openai.client import DeltaStream, EngineDeadError
from omnistage.entrypoints.openai.deltas import SequenceDelta, TokenLogprob
from omnistage.entrypoints.openai.errors import OpenAIError
from omnistage.entrypoints.openai.protocol import (
    MAX_CHOICES,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    Usage,
)
from omnistage.entrypoints.openai.serving import (
    ERROR_RESPONSES,
    MIN_LOGPROB,
    OpenAIServing,
    check_not_aborted,
    merge_streams,
    stream_error,
    usage,
)
from omnistage.entrypoints.openai.sse import DONE, EventStream, sse, until_disconnect

DEFAULT_MAX_TOKENS = 16
"""OpenAI's completions default, where the client's defaults set none."""


class CompletionServing(OpenAIServing):
    def register(self, router: APIRouter) -> None:
        router.add_api_route(
            "/v1/completions",
            self.create,
            methods=["POST"],
            response_model=None,
            responses={200: {"model": CompletionResponse}, **ERROR_RESPONSES},
        )

    async def create(self, body: CompletionRequest, raw: Request) -> Response:
        self.check_model(body.model)
        self.check_stream_options(body)
        self.check_supported(body)
        clamp = "max_tokens" not in body.model_fields_set  # the default adapts
        max_tokens = body.max_tokens
        if clamp:
            max_tokens = self.ctx.client.default_sampling.get("max_tokens") or DEFAULT_MAX_TOKENS
        params = self.sampling_params(body, max_tokens, body.logprobs)
        prompts = _prompts(body.prompt)
        request_id = f"cmpl-{uuid.uuid4().hex}"
        renames = {"prompt_token_ids": "prompt"}
        streams = await self.add_requests(
            prompts, params, request_id, renames, clamp_max_tokens=clamp
        )
        echoes = [self._echo(p) if body.echo else "" for p in prompts]
        run = _Completion(body, request_id, streams, echoes)
        if body.stream:
            return EventStream(run.events())
        response = await until_disconnect(raw, run.collect())
        return JSONResponse(response.model_dump())

    def check_supported(self, body: CompletionRequest) -> None:
        client = self.ctx.client
        if "text" not in client.produces:
            raise OpenAIError(
                "model: /v1/completions is not available for this model: its multi-stage "
                "pipeline produces no text; it answers " + client.other_endpoints,
                param="model",
            )
        if body.n != 1 and not client.multiple_samples:
            raise OpenAIError(
                "n: a multi-stage pipeline generates one sequence per prompt", param="n"
            )
        if body.logprobs is not None and not client.reports_logprobs:
            raise OpenAIError(
                "logprobs: a multi-stage pipeline does not report logprobs", param="logprobs"
            )
        prompts = len(_prompts(body.prompt))
        if prompts * body.n > MAX_CHOICES:
            raise OpenAIError(
                f"prompt: {prompts} prompts x n {body.n} = {prompts * body.n} sequences, over "
                f"the limit of {MAX_CHOICES} in one request",
                param="prompt",
            )
        if body.suffix is not None:
            raise OpenAIError("suffix: insertion is not supported", param="suffix")
        if body.best_of is not None and body.best_of != body.n:
            raise OpenAIError("best_of: only best_of equal to n is supported", param="best_of")
        if body.echo and body.logprobs is not None:
            raise OpenAIError(
                "echo: not supported together with logprobs (no prompt logprobs)", param="echo"
            )

    def _echo(self, prompt: str | list[int]) -> str:
        return prompt if isinstance(prompt, str) else self.ctx.client.tokenizer.decode(prompt)


def _prompts(prompt: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]  # type: ignore[arg-type]
    return list(prompt)  # type: ignore[arg-type]


class _Completion:
    """One completion request's choices, built from its engine requests' deltas."""

    def __init__(
        self,
        body: CompletionRequest,
        request_id: str,
        streams: list[DeltaStream],
        echoes: list[str],
    ) -> None:
        self.body, self.request_id, self.streams, self.echoes = body, request_id, streams, echoes
        self.created = int(time.time())
        n = body.n * len(streams)
        self.texts = [echoes[i // body.n] for i in range(n)]
        self.logprobs = [CompletionLogprobs() for _ in range(n)]
        self.finish: list[tuple[str | None, int | str | None]] = [(None, None)] * n
        self.generated = self.cached = 0

    def _add(self, prompt_index: int, seq: SequenceDelta) -> tuple[int, CompletionChoice]:
        index = prompt_index * self.body.n + seq.index
        offset = len(self.texts[index])
        self.texts[index] += seq.text
        self.generated += len(seq.token_ids)
        if seq.finish_reason is not None:
            self.finish[index] = (seq.finish_reason, seq.stop_reason)
        logprobs = None
        if self.body.logprobs is not None:
            logprobs = _legacy_logprobs(seq.logprobs or [], offset)
            target = self.logprobs[index]
            target.tokens += logprobs.tokens
            target.token_logprobs += logprobs.token_logprobs
            target.top_logprobs += logprobs.top_logprobs
            target.text_offset += logprobs.text_offset
        choice = CompletionChoice(
            index=index,
            text=seq.text,
            logprobs=logprobs,
            finish_reason=seq.finish_reason,
            stop_reason=seq.stop_reason,
        )
        return index, choice

    def _usage(self) -> Usage:
        prompt_tokens = sum(s.num_prompt_tokens for s in self.streams)
        return usage(prompt_tokens, self.generated, self.cached)

    async def collect(self) -> CompletionResponse:
        async for prompt_index, delta in merge_streams(self.streams):
            check_not_aborted(delta)
            self.cached += delta.num_cached_tokens if delta.finished else 0
            for seq in delta.sequences:
                self._add(prompt_index, seq)
        choices = [
            CompletionChoice(
                index=i,
                text=text,
                logprobs=self.logprobs[i] if self.body.logprobs is not None else None,
                finish_reason=self.finish[i][0],
                stop_reason=self.finish[i][1],
            )
            for i, text in enumerate(self.texts)
        ]
        return self._response(choices, self._usage())

    async def events(self) -> AsyncIterator[str]:
        if self.body.echo:
            for index, text in enumerate(self.texts):
                yield sse(self._response([CompletionChoice(index=index, text=text)]))
        try:
            async for prompt_index, delta in merge_streams(self.streams):
                check_not_aborted(delta)
                self.cached += delta.num_cached_tokens if delta.finished else 0
                for seq in delta.sequences:
                    _, choice = self._add(prompt_index, seq)
                    yield sse(self._response([choice]))
        except (OpenAIError, EngineDeadError) as exc:
            yield stream_error(exc)
            yield DONE
            return
        if self.body.stream_options is not None and self.body.stream_options.include_usage:
            yield sse(self._response([], self._usage()))
        yield DONE

    def _response(
        self, choices: list[CompletionChoice], usage: Usage | None = None
    ) -> CompletionResponse:
        return CompletionResponse(
            id=self.request_id,
            created=self.created,
            model=self.body.model,
            choices=choices,
            usage=usage,
        )


def _legacy_logprobs(entries: list[TokenLogprob], offset: int) -> CompletionLogprobs:
    """Completions' logprobs shape: parallel lists, top-N as {token text: logprob}."""
    out = CompletionLogprobs()
    for e in entries:
        out.tokens.append(e.token)
        out.token_logprobs.append(max(e.logprob, MIN_LOGPROB))
        out.top_logprobs.append({t: max(lp, MIN_LOGPROB) for t, _, lp in e.top})
        out.text_offset.append(offset)
        offset += len(e.token)
    return out
