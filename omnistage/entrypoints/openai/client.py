"""`EngineClient`: what the serving layer asks of whatever runs the model.

There is one serving path. A text model (`engine_client.AsyncEngineClient`: one
`LLMEngine` on its own thread) and a multi-stage pipeline
(`pipeline_client.PipelineClient`: an `AsyncOmni`) both implement `EngineClient`,
so one chat handler, one completion handler and one error mapping serve either;
what a model can do is read from the client (`produces`, `multiple_samples`,
`reports_logprobs`, `input_modalities`), never from its type. A text model is, to
the handlers, a one-stage pipeline whose only stage ("llm") writes text.

    chat = await asyncio.to_thread(client.render_chat, messages)   # ValueError: bad input
    stream = await client.add_request(chat, params, request_id)    # ValueError: bad input
    async with stream:                                             # leaving early aborts it
        async for delta in stream:                                 # deltas.RequestDelta
            ...

`add_request` refuses bad input (a `ValueError` whose message starts with the
field it is about) before any response starts, and `EngineDeadError` when the
model no longer runs; the serving layer maps both (`serving.OpenAIServing`). A
request that fails later raises from the stream (`errors.OpenAIError` with its
status, or `EngineDeadError`).

This module imports nothing heavy: `errors` and `metrics` depend on it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from omnistage.sampling_params import SamplingParams
from omnistage.spec_decode.stats import SpecDecodeStats


class EngineDeadError(RuntimeError):
    """The engine stopped (shut down, or it failed); no request can run."""


@dataclass(frozen=True)
class ChatPrompt:
    """A chat rendered by a client's `render_chat`, ready for its `add_request`."""

    prompt: Any
    """The client's own prompt: the template's text (a text model), or a pipeline prompt
    dict with the media (`{"prompt": ..., "multi_modal_data": ...}`)."""
    num_tokens: int | None = None
    """The tokens the model receives for it, where the client knows them before adding it
    (a pipeline counts them in the frontend; a text model tokenizes in `add_request`)."""


@dataclass(frozen=True)
class EngineStats:
    """A text engine's snapshot, published after every step and command."""

    num_waiting: int = 0
    num_running: int = 0
    num_unfinished: int = 0
    """Requests the engine still tracks (an n>1 request counts once)."""
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    spec_decode: SpecDecodeStats | None = None
    """Speculation totals (a copy), when the engine speculates."""

    @property
    def kv_cache_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0


@dataclass(frozen=True)
class StageGauges:
    """One pipeline stage's scheduler state as its last stats reply gave it."""

    num_waiting: int = 0
    """Requests waiting for input or to be scheduled."""
    num_running: int = 0
    """Requests being computed."""
    kv_cache_usage: float = 0.0
    """Fraction of the stage's KV cache blocks in use (0 for stages without one)."""
    spec_decode: SpecDecodeStats | None = None
    """Speculation totals of a stage that speculates."""
    resources: Mapping[str, int] = field(default_factory=dict)
    """What the stage holds (`StageCore.counters`: engine requests, KV blocks,
    accumulator and coordinator entries, ...): all 0 when nothing runs."""


class EngineObserver(Protocol):
    """Per-request events for metrics (`metrics.ServerMetrics`); keep them cheap."""

    def on_first_token(self, stage: str, seconds: float) -> None: ...
    def on_inter_token(self, stage: str, seconds: float) -> None: ...
    def on_finished(
        self, stage: str, reason: str, prompt_tokens: int, generated_tokens: int, seconds: float
    ) -> None: ...
    def on_first_audio(self, stage: str, seconds: float) -> None: ...
    def track_stage(self, stage: str, stats: Callable[[], EngineStats | StageGauges]) -> None: ...
    def track_stage_health(self, health: Callable[[], Mapping[str, Any]]) -> None:
        """A pipeline's stages: `health()` maps each to its `StageHealth` (state, restarts,
        failures), read at each scrape."""

    def track_open_requests(self, count: Callable[[], int]) -> None:
        """A pipeline's orchestrator: the requests it tracks now, read at each scrape."""


class DeltaStream(Protocol):
    """One request's `RequestDelta`s in order, ending after the one marked `finished`."""

    request_id: str
    finished: bool

    @property
    def num_prompt_tokens(self) -> int:
        """The tokens the model received for the prompt (usage's `prompt_tokens`)."""
        ...

    def __aiter__(self) -> DeltaStream: ...
    async def __anext__(self) -> Any: ...
    def abort(self) -> None:
        """End the request everywhere unless it already ended (idempotent, never blocks)."""

    async def __aenter__(self) -> DeltaStream: ...
    async def __aexit__(self, *exc: object) -> None: ...
    def final_audio(self) -> tuple[Any, int] | None:
        """(samples, sample rate) of the whole answer's audio, once finished; None without."""
        ...


class EngineClient(Protocol):
    """The model behind the server (see the module docstring)."""

    stage: str
    """The label of the client's own metrics ("llm"; "pipeline")."""
    max_model_len: int | None
    """The context length of the stage that reads the prompt (None: not autoregressive)."""
    produces: tuple[str, ...]
    """Modalities a chat can ask for ("text", "audio", "image"); empty: it answers no chat."""
    multiple_samples: bool
    """Whether a request may ask for `n` > 1 samples."""
    reports_logprobs: bool
    input_modalities: frozenset[str]
    """Media a chat message may carry besides text ("audio", "image")."""
    draws: bool
    """Whether it draws images (POST /v1/images/generations)."""
    speaks: bool
    """Whether it speaks (POST /v1/audio/speech, chat audio)."""
    other_endpoints: str
    """The generating endpoints it answers besides chat and completions (for 400s)."""

    @property
    def tokenizer(self) -> Any: ...
    @property
    def is_alive(self) -> bool: ...
    def health_report(self) -> dict[str, Any]:
        """The body of GET /health while the client is alive: `status` "ok", or another
        status (a 503) and what is wrong."""
        ...

    @property
    def default_sampling(self) -> Mapping[str, Any]:
        """The SamplingParams fields a request starts from (its fields go over them)."""
        ...

    def start(self) -> None: ...
    def begin_shutdown(self) -> None:
        """Refuse new requests and abort every running one (their responses end now)."""

    def shutdown(self, timeout: float = 30.0) -> None: ...
    def observe(self, observer: EngineObserver) -> None:
        """Report metrics to `observer`, and register its stages' gauges with it."""

    def refresh_stage_stats(self) -> None:
        """Update the gauges `observe` registered (blocks: not on the event loop)."""

    def render_chat(
        self, messages: list[dict[str, Any]], chat_template_kwargs: Any = None
    ) -> ChatPrompt:
        """The chat through the model's template with `chat_template_kwargs` (blocks: not on
        the event loop), as `multimodal.request_chat.render_request_chat` renders it for
        every client. ValueError naming the field for messages it cannot take."""
        ...

    def check_voice(self, voice: str | None, param: str) -> str | None: ...

    async def add_request(
        self,
        prompt: str | list[int] | ChatPrompt,
        params: SamplingParams,
        request_id: str,
        *,
        modalities: Sequence[str] = ("text",),
        voice: str | None = None,
        clamp_max_tokens: bool = False,
        draw: Any = None,
    ) -> DeltaStream:
        """Add a request: a completion prompt (text, tokenized with special tokens, or
        token ids) or a rendered chat. `max_tokens` that do not fit the context with the
        prompt is a ValueError naming max_tokens, unless `clamp_max_tokens` (then what fits
        is generated). `modalities`: what to answer with (a subset of `produces`); `draw`:
        the draw stage's `DiffusionParams` when it includes the image."""
        ...
