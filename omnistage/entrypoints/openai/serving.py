"""The base of every endpoint ("serving" object), and what endpoints share.

An endpoint family is a subclass of `OpenAIServing` that adds its routes to the
app's router in `register`; `build_app` makes one of each class it is given.
Adding an endpoint (e.g. `/v1/audio/speech`) is a new module with

    class SpeechServing(OpenAIServing):
        @classmethod
        def enabled(cls, ctx: ServingContext) -> bool:   # only where the model speaks
            return ...

        def register(self, router: APIRouter) -> None:
            router.add_api_route("/v1/audio/speech", self.create, methods=["POST"])

        async def create(self, body: SpeechRequest, raw: Request) -> Response: ...

and its class in `api_server.DEFAULT_SERVINGS` (or in `build_app(servings=...)`).
Raise `OpenAIError` for anything the client got wrong; `add_request` turns the
client's `ValueError`s into 400s naming the field, whichever `EngineClient` (a text
model, a pipeline) serves: one error mapping for every model.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from fastapi import APIRouter

from omnistage.entrypoints.openai.client import (
    ChatPrompt,
    DeltaStream,
    EngineClient,
    EngineDeadError,
)
from omnistage.entrypoints.openai.deltas import RequestDelta
from omnistage.entrypoints.openai.errors import OpenAIError, error_info
from omnistage.entrypoints.openai.metrics import ServerMetrics
from omnistage.entrypoints.openai.protocol import ErrorResponse, SamplingFields, Usage
from omnistage.entrypoints.openai.sse import sse
from omnistage.sampling_params import SamplingParams

REQUEST_FIELDS = (
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
"""Request fields that become SamplingParams fields of the same name."""
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 404, 503)
}
"""OpenAPI documentation of the error answers of the generating endpoints."""
MIN_LOGPROB = -9999.0  # JSON has no -inf


@dataclass
class ServingContext:
    """What every endpoint of one app shares."""

    client: EngineClient
    served_model_names: list[str]
    """Names a request's `model` may give (a response names the one its request gave)."""
    model_path: str | None = None
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    created: int = field(default_factory=lambda: int(time.time()))


class OpenAIServing:
    """One endpoint family: its routes, and how its requests become engine work."""

    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    @classmethod
    def enabled(cls, ctx: ServingContext) -> bool:
        """Whether the served model can answer this endpoint at all (default: yes)."""
        return True

    def register(self, router: APIRouter) -> None:
        """Add this endpoint's routes to `router`."""
        raise NotImplementedError

    # -- helpers for subclasses ----------------------------------------------------------------
    def check_model(self, name: str) -> None:
        if name not in self.ctx.served_model_names:
            served = ", ".join(self.ctx.served_model_names)
            raise OpenAIError(
                f"model: the model `{name}` does not exist; this server serves: {served}",
                HTTPStatus.NOT_FOUND,
                param="model",
                code="model_not_found",
            )

    @staticmethod
    def check_stream_options(body: SamplingFields) -> None:
        if body.stream_options is not None and not body.stream:
            raise OpenAIError(
                "stream_options: only allowed when stream is true", param="stream_options"
            )

    def sampling_params(
        self,
        body: SamplingFields,
        max_tokens: int | None,
        logprobs: int | None,
        renames: Mapping[str, str] | None = None,
        model_options: dict[str, Any] | None = None,
    ) -> SamplingParams:
        """The request's SamplingParams: the fields it gives (not None) over the client's
        defaults (`EngineClient.default_sampling`: a pipeline's entry-stage defaults; where
        neither says, SamplingParams' own, which are OpenAI's), `max_tokens` and the entry
        stage's `model_options` when not None. A bad value is a 400 naming the field
        (`renames`: engine names to the request's)."""
        given = body.model_fields_set
        fields: dict[str, Any] = {
            f: getattr(body, f)
            for f in REQUEST_FIELDS
            if f in given and getattr(body, f) is not None
        }
        if "logit_bias" in fields:
            fields["logit_bias"] = dict(fields["logit_bias"])
        fields["n"] = body.n
        if logprobs is not None:
            fields["logprobs"] = logprobs
        if max_tokens is not None:
            fields["max_tokens"] = max_tokens
        if model_options is not None:
            fields["model_options"] = model_options
        try:
            return SamplingParams(**{**self.ctx.client.default_sampling, **fields})
        except (ValueError, TypeError) as exc:
            raise OpenAIError.from_value_error(ValueError(str(exc)), renames) from None

    async def add_request(
        self,
        prompt: str | list[int] | ChatPrompt,
        params: SamplingParams,
        request_id: str,
        renames: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> DeltaStream:
        """`client.add_request`, its errors as OpenAIErrors (400 naming the field, 503 when
        the engine is not running)."""
        try:
            return await self.ctx.client.add_request(prompt, params, request_id, **kwargs)
        except ValueError as exc:
            raise OpenAIError.from_value_error(exc, renames) from None
        except EngineDeadError as exc:
            raise OpenAIError(str(exc), HTTPStatus.SERVICE_UNAVAILABLE) from None

    async def add_requests(
        self,
        prompts: Sequence[str | list[int]],
        params: SamplingParams,
        request_id: str,
        renames: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> list[DeltaStream]:
        """One request per prompt (ids `{request_id}-{i}`), added together; all or none are
        added (the first prompt's error, in prompt order, is raised)."""
        ids = [
            request_id if len(prompts) == 1 else f"{request_id}-{i}" for i in range(len(prompts))
        ]
        adds = [
            self.add_request(p, params, rid, renames, **kwargs)
            for p, rid in zip(prompts, ids, strict=True)
        ]
        results = await asyncio.gather(*adds, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            for stream in results:
                if not isinstance(stream, BaseException):
                    stream.abort()
            raise errors[0]
        return results  # type: ignore[return-value]


def usage(num_prompt: int, num_generated: int, num_cached: int = 0) -> Usage:
    return Usage(
        prompt_tokens=num_prompt,
        completion_tokens=num_generated,
        total_tokens=num_prompt + num_generated,
        prompt_tokens_details={"cached_tokens": num_cached},
    )


def check_not_aborted(delta: RequestDelta) -> None:
    """A request the server aborted (it is shutting down) answers 503; one the model failed
    on (finish reason "error": a step raised and the engine pinned it on this request)
    answers 500 — the other requests go on."""
    reasons = {s.finish_reason for s in delta.sequences}
    if "abort" in reasons:
        raise OpenAIError(
            "the request was aborted: the server is shutting down",
            HTTPStatus.SERVICE_UNAVAILABLE,
        )
    if "error" in reasons:
        raise OpenAIError(
            "the model failed on this request (the server log has the error)",
            HTTPStatus.INTERNAL_SERVER_ERROR,
        )


def stream_error(exc: Exception) -> str:
    """An error in the middle of a stream, as an event of OpenAI's error shape: the
    error's own type, param and code, the code being the HTTP status it would have had
    (the stream's 200 is already sent) unless it names one."""
    if not isinstance(exc, OpenAIError):
        exc = OpenAIError(str(exc), HTTPStatus.SERVICE_UNAVAILABLE)
    info = error_info(exc.message, exc.status, exc.param, exc.type, exc.code or exc.status)
    return sse(ErrorResponse(error=info).model_dump_json())  # nulls kept: every field is there


async def merge_streams(streams: list[DeltaStream]) -> AsyncIterator[tuple[int, RequestDelta]]:
    """(stream index, delta) of several requests as they arrive; leaving early (or an
    error) aborts every request not yet finished."""
    pending: dict[asyncio.Future[RequestDelta], int] = {}
    try:
        for i, stream in enumerate(streams):
            pending[asyncio.ensure_future(anext(stream))] = i
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                i = pending.pop(task)
                delta = task.result()
                if not streams[i].finished:
                    pending[asyncio.ensure_future(anext(streams[i]))] = i
                yield i, delta
    finally:
        for task in pending:
            task.cancel()
        for stream in streams:
            stream.abort()
