"""POST /v1/completions over a multi-stage pipeline whose entry stage writes text.

As vLLM-Omni does (it keeps vLLM's completions endpoint on an `AsyncOmni`), a
pipeline that produces text answers completions: each prompt (a string or token
ids, or a list of them) goes to the entry (thinker) stage as it is — no chat
template — and the choice's text is the thinker's; only the stages the text needs
run. Choice `i` answers prompt `i`; `n` > 1, `logprobs`, `suffix` and `best_of` > 1
are 400s (a pipeline generates one sequence and reports no logprobs). Sampling
fields go to the thinker over its deploy defaults, as in chat; `max_tokens` given
must fit the thinker's context with the prompt (else a 400 naming it); left out,
it is the stage's default (else OpenAI's 16), clamped to what fits. `usage`: the
thinker's prompt tokens (its tokenizer, as its engine counts them) and its
generated tokens. With `stream`: one chunk per piece of text (one choice each),
the finish reasons, the usage (`stream_options.include_usage`), `[DONE]`.

A pipeline without a text-producing final stage (it only draws or speaks) answers
a 400 saying the endpoint is not available for it, and which endpoints are.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from omnistage.entrypoints.openai.errors import OpenAIError
from omnistage.entrypoints.openai.pipeline_client import PipelineClient
from omnistage.entrypoints.openai.protocol import (
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
)
from omnistage.entrypoints.openai.serving import (
    ERROR_RESPONSES,
    OpenAIServing,
    ServingContext,
    stream_error,
    usage,
)
from omnistage.entrypoints.openai.serving_completion import _prompts
from omnistage.entrypoints.openai.serving_pipeline_chat import check_context, stage_params
from omnistage.entrypoints.openai.sse import DONE, EventStream, sse, until_disconnect
from omnistage.pipeline.outputs import OmniRequestOutput

DEFAULT_MAX_TOKENS = 16
"""OpenAI's completions default, where the thinker's deploy sets none."""
Updates = AsyncIterator[OmniRequestOutput]


class PipelineCompletionServing(OpenAIServing):
    @classmethod
    def enabled(cls, ctx: ServingContext) -> bool:
        return isinstance(ctx.client, PipelineClient)

    @property
    def client(self) -> PipelineClient:
        return self.ctx.client  # type: ignore[return-value]

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
        text_stage = self.check_supported(body)
        self.check_stream_options(body)
        prompts = _prompts(body.prompt)
        counts = await asyncio.to_thread(lambda: [self._count(p) for p in prompts])
        given = "max_tokens" in body.model_fields_set
        (entry,) = self.client.deploy.entry_stages
        max_tokens = body.max_tokens if given else None
        for count in counts:
            check_context(self.client, count, max_tokens, "max_tokens", "prompt")
        if not given:
            default = entry.default_sampling.get("max_tokens") or DEFAULT_MAX_TOKENS
            limit = self.client.max_model_len
            room = min(limit - c for c in counts) if limit is not None else default
            max_tokens = min(default, room)
        params = stage_params(self.client, body, max_tokens, "max_tokens")
        request_id = f"cmpl-{uuid.uuid4().hex}"
        run = _PipelineCompletion(body, request_id, text_stage, counts)
        if body.echo:
            run.texts = [self._echo(p) for p in prompts]
        renames = {"prompt_token_ids": "prompt"}
        updates = [
            self.client.generate(
                _pipeline_prompt(p),
                params,
                ["text"],
                request_id if len(prompts) == 1 else f"{request_id}-{i}",
                renames,
            )
            for i, p in enumerate(prompts)
        ]
        firsts = await _start_all(updates)  # 400s are raised here, before the response starts
        if body.stream:
            return EventStream(run.events(updates, firsts))
        response = await until_disconnect(raw, run.collect(updates, firsts))
        return JSONResponse(response.model_dump())

    def check_supported(self, body: CompletionRequest) -> str:
        """The stage whose text answers; a 400 for what a pipeline cannot do."""
        text = self.client.final_stage("text")
        if text is None:
            raise OpenAIError(
                "model: /v1/completions is not available for this model: its multi-stage "
                "pipeline produces no text; it answers " + self.client.other_endpoints,
                param="model",
            )
        if body.n != 1:
            raise OpenAIError(
                "n: a multi-stage pipeline generates one sequence per prompt", param="n"
            )
        if body.logprobs is not None:
            raise OpenAIError(
                "logprobs: a multi-stage pipeline does not report logprobs", param="logprobs"
            )
        if body.suffix is not None:
            raise OpenAIError("suffix: insertion is not supported", param="suffix")
        if body.best_of not in (None, 1):
            raise OpenAIError(
                "best_of: a multi-stage pipeline generates one sequence per prompt",
                param="best_of",
            )
        return text.name

    def _count(self, prompt: str | list[int]) -> int:
        return len(prompt) if isinstance(prompt, list) else self.client.count_prompt_tokens(prompt)

    def _echo(self, prompt: str | list[int]) -> str:
        return prompt if isinstance(prompt, str) else self.client.tokenizer.decode(prompt)


def _pipeline_prompt(prompt: str | list[int]) -> str | dict[str, Any]:
    return prompt if isinstance(prompt, str) else {"prompt_token_ids": prompt}


async def _start_all(updates: list[Updates]) -> list[OmniRequestOutput]:
    """The first update of every request, started together; if any fails, every request is
    closed (aborted) and the first error raised."""
    tasks = [asyncio.ensure_future(anext(u)) for u in updates]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await _close_all(updates)
        raise


async def _close_all(updates: list[Updates]) -> None:
    for u in updates:
        with contextlib.suppress(Exception):
            await u.aclose()  # type: ignore[attr-defined]


async def _merge(
    updates: list[Updates], firsts: list[OmniRequestOutput]
) -> AsyncIterator[tuple[int, OmniRequestOutput]]:
    """(prompt index, update) of every request as they come, the first ones first;
    leaving early (or an error) closes, and so aborts, every request."""
    queue: asyncio.Queue[tuple[int, OmniRequestOutput | BaseException | None]] = asyncio.Queue()

    async def pump(i: int) -> None:
        try:
            async for output in updates[i]:
                queue.put_nowait((i, output))
        except Exception as exc:
            queue.put_nowait((i, exc))
        else:
            queue.put_nowait((i, None))

    for i, first in enumerate(firsts):
        yield i, first
    pending = {i for i, first in enumerate(firsts) if not first.finished}
    tasks = [asyncio.ensure_future(pump(i)) for i in sorted(pending)]
    try:
        while pending:
            i, item = await queue.get()
            if item is None:
                pending.discard(i)
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
        await _close_all(updates)


class _PipelineCompletion:
    """One completion request's choices (one per prompt) from its pipeline requests."""

    def __init__(
        self, body: CompletionRequest, request_id: str, text_stage: str, counts: list[int]
    ) -> None:
        self.body, self.request_id, self.text_stage = body, request_id, text_stage
        self.created = int(time.time())
        self.num_prompt = sum(counts)
        self.texts = [""] * len(counts)
        self.finish: list[str | None] = [None] * len(counts)
        self.generated = 0

    def _add(self, i: int, output: OmniRequestOutput) -> str:
        """Record an update of prompt `i`'s request; its new text."""
        if output.stage != self.text_stage:
            return ""
        self.generated += len(output.new_token_ids)
        self.texts[i] += output.new_text
        result = output.outputs.get(self.text_stage)
        if result is not None and result.finished:
            self.finish[i] = result.finish_reason
        return output.new_text

    async def collect(
        self, updates: list[Updates], firsts: list[OmniRequestOutput]
    ) -> CompletionResponse:
        async for i, output in _merge(updates, firsts):
            self._add(i, output)
        choices = [
            CompletionChoice(index=i, text=text, finish_reason=self.finish[i] or "stop")
            for i, text in enumerate(self.texts)
        ]
        return self._response(choices, usage(self.num_prompt, self.generated))

    async def events(
        self, updates: list[Updates], firsts: list[OmniRequestOutput]
    ) -> AsyncIterator[str]:
        if self.body.echo:
            for i, text in enumerate(self.texts):
                yield sse(self._response([CompletionChoice(index=i, text=text)]))
        done = [False] * len(firsts)
        try:
            async for i, output in _merge(updates, firsts):
                new = self._add(i, output)
                ended = output.finished and not done[i]
                if new or ended:
                    done[i] = done[i] or ended
                    reason = (self.finish[i] or "stop") if ended else None
                    choice = CompletionChoice(index=i, text=new, finish_reason=reason)
                    yield sse(self._response([choice]))
        except OpenAIError as exc:  # a shutdown or a failed stage
            yield stream_error(exc)
            yield DONE
            return
        if self.body.stream_options is not None and self.body.stream_options.include_usage:
            yield sse(self._response([], usage(self.num_prompt, self.generated)))
        yield DONE

    def _response(self, choices: list[CompletionChoice], used: Any = None) -> CompletionResponse:
        return CompletionResponse(
            id=self.request_id,
            created=self.created,
            model=self.body.model,
            choices=choices,
            usage=used,
        )
