"""`PipelineClient`: a multi-stage pipeline (`AsyncOmni`) as the server's `EngineClient`.

`omnistage serve` serves a model whose deploy has more than one stage (`demo-image`,
`demo-omni`, an omni or image checkpoint, `--deploy FILE|NAME`) through it. Chat and
completions reach it through `add_request` (a `PipelineStream` of deltas); the speech
and image endpoints read `generate`'s raw `OmniRequestOutput` updates. Either way a
request is aborted in every stage when its caller stops listening.

What it answers follows from its deploy: text where a final stage writes it, `speaks`
(`final_output_type: audio`: chat audio, POST /v1/audio/speech), `draws` (`image`:
POST /v1/images/generations). `max_model_len` is the entry (thinker) stage's, read
from configuration (`pipeline_deploy`); `refresh_stage_stats` asks every stage for
its gauges (queue depth, KV cache use), which /metrics exports per stage.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import signal
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from http import HTTPStatus
from typing import Any

from omnistage.entrypoints.openai.client import (
    ChatPrompt,
    EngineDeadError,
    EngineObserver,
    StageGauges,
)
from omnistage.entrypoints.openai.errors import OpenAIError
from omnistage.entrypoints.openai.pipeline_deploy import (
    check_context,
    entry_max_model_len,
    stage_params,
)
from omnistage.entrypoints.openai.pipeline_stream import PipelineStream
from omnistage.entrypoints.openai.voice_choice import VoiceChoice
from omnistage.pipeline.deploy_spec import DeploySpec
from omnistage.pipeline.omni import AsyncOmni
from omnistage.pipeline.orchestrator import StageHealth
from omnistage.pipeline.outputs import OmniRequestOutput
from omnistage.sampling_params import SamplingParams
from omnistage.spec_decode.stats import SpecDecodeStats

logger = logging.getLogger(__name__)

_REFUSED = re.compile(r"^stage (\S+): ([A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])?: .*)", re.DOTALL)
"""A failure that is a stage refusing the request's input: "stage NAME: field: why"."""


class PipelineClient(VoiceChoice):
    """An `AsyncOmni` driven by the server (the app starts nothing: the stages start here);
    a `client.EngineClient` (one sequence per request, no logprobs)."""

    stage = "pipeline"
    multiple_samples = False
    reports_logprobs = False

    def __init__(
        self,
        deploy: DeploySpec | str | os.PathLike | Mapping[str, Any] | None = None,
        model: str | None = None,
        *,
        in_process: bool = False,
        omni: AsyncOmni | None = None,
    ) -> None:
        if omni is None:
            # Stage processes inherit an ignored SIGINT: Ctrl-C reaches only the server,
            # which then stops them.
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                omni = AsyncOmni(deploy, model=model, in_process=in_process)
            finally:
                signal.signal(signal.SIGINT, previous)
        self.omni = omni
        self.deploy: DeploySpec = omni.deploy
        self.observer: Any = None
        (entry,) = self.deploy.entry_stages
        self.max_model_len: int | None = entry_max_model_len(entry)
        """The thinker's context length (None: the entry stage is not autoregressive)."""
        self._stage_stats: dict[str, StageGauges] = {}
        self._active: set[str] = set()
        self._stopping = False
        self._closed = False

    # -- what the deploy can answer ---------------------------------------------------------------
    def final_stage(self, modality: str):
        return next((s for s in self.deploy.final_stages if s.final_output_type == modality), None)

    @property
    def draws(self) -> bool:
        return self.final_stage("image") is not None

    @property
    def speaks(self) -> bool:
        return self.final_stage("audio") is not None

    @property
    def produces(self) -> tuple[str, ...]:
        """What a chat can ask for: text (where a final stage writes it), audio where one
        speaks too, the image where one draws; nothing for a pipeline that only speaks."""
        text = ("text",) if self.final_stage("text") is not None else ()
        audio = ("audio",) if text and self.speaks else ()
        return text + audio + (("image",) if self.draws else ())

    @functools.cached_property
    def input_modalities(self) -> frozenset[str]:
        return frozenset(self.omni._prompts.input_modalities)

    @property
    def default_sampling(self) -> Mapping[str, Any]:
        """The entry stage's deploy defaults (what a request leaves out keeps them)."""
        (entry,) = self.deploy.entry_stages
        return entry.default_sampling

    @property
    def other_endpoints(self) -> str:
        """The generating endpoints a pipeline without text answers (for its 400s)."""
        paths = {"/v1/images/generations": self.draws, "/v1/audio/speech": self.speaks}
        return ", ".join(p for p, ok in paths.items() if ok) or "no generating endpoint"

    @property
    def diffusion_limits(self):
        """The draw stage's `DiffusionLimits` (sizes it can draw), or None."""
        stage = self.final_stage("image")
        return None if stage is None else self.omni._params.limits.get(stage.name)

    @property
    def entry_model(self) -> str | None:
        (entry,) = self.deploy.entry_stages
        return entry.with_part_directory().model

    @functools.cached_property
    def entry_builds_its_prompt(self) -> bool:
        """Whether the entry stage renders its prompt itself (GLM-Image's prior states the
        image size in its prompt): requests then pass the text as it is, not as a chat."""
        from omnistage.entrypoints.entry_prompt import entry_builds_its_prompt

        return entry_builds_its_prompt(self.deploy)

    # -- lifecycle (the app's lifespan, `Server`) ----------------------------------------------
    @property
    def is_alive(self) -> bool:
        """The pipeline runs (some of its stages may be restarting or down: `stage_health`)."""
        orchestrator = self.omni.orchestrator
        return not self._stopping and not self._closed and orchestrator._thread.is_alive()

    def stage_health(self) -> Mapping[str, StageHealth]:
        """Each stage's state (up, restarting, down), restarts and last failure."""
        return self.omni.orchestrator.health()

    def health_report(self) -> dict[str, Any]:
        """The body of GET /health: `status` ok (every stage up), degraded (a stage is
        restarting) or down (a stage was given up), and each stage's state, restarts,
        failures and last failure. Anything but ok is answered with a 503: a load balancer
        takes the server out of rotation until it is whole again."""
        stages = self.stage_health()
        states = {h.state for h in stages.values()}
        status = "down" if "down" in states else "degraded" if "restarting" in states else "ok"
        return {
            "status": status,
            "stages": {
                name: {
                    "state": h.state,
                    "restarts": h.restarts,
                    "failures": h.failures,
                    "reason": h.reason,
                }
                for name, h in stages.items()
            },
        }

    def start(self) -> None:
        """Nothing to do: the stages started with the `AsyncOmni`."""

    def begin_shutdown(self) -> None:
        """Refuse new requests and abort every one in flight (their responses end now)."""
        self._stopping = True
        for request_id in list(self._active):
            self.omni.orchestrator.abort(request_id)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop every stage process (idempotent)."""
        self._stopping = True
        if not self._closed:
            self._closed = True
            self.omni.shutdown()

    def stats(self) -> dict[str, dict[str, int]]:
        """Every stage's resource counters (blocks: not on the event loop)."""
        return self.omni.stage_counters()

    @property
    def stage_names(self) -> list[str]:
        return [s.name for s in self.deploy.stages]

    def observe(self, observer: EngineObserver) -> None:
        """Report time to first audio to `observer`, every stage's gauges and health."""
        self.observer = observer
        for stage in self.stage_names:
            observer.track_stage(stage, functools.partial(self.stage_stats, stage))
        observer.track_stage_health(self.stage_health)
        observer.track_open_requests(self.omni.orchestrator.num_tracked)

    def refresh_stage_stats(self, timeout: float = 5.0) -> None:
        """Ask every stage for its scheduler gauges (blocks: not on the event loop). A stage
        that does not answer (dead, or the pipeline stopped) keeps its last snapshot."""
        if self._closed:
            return
        try:
            replies = self.omni.orchestrator.stage_stats(timeout)
        except Exception:  # a stopped or stuck pipeline: the last snapshot stands
            logger.warning("the pipeline's stages did not report their stats", exc_info=True)
            return
        for name, reply in replies.items():
            gauges, spec = reply.gauges, reply.speculation
            self._stage_stats[name] = StageGauges(
                num_waiting=int(gauges.get("num_waiting", 0)),
                num_running=int(gauges.get("num_running", 0)),
                kv_cache_usage=float(gauges.get("kv_cache_usage", 0.0)),
                spec_decode=None if spec is None else SpecDecodeStats(**spec),
                resources=dict(reply.counters),
            )

    def stage_stats(self, stage: str) -> StageGauges:
        """The stage's gauges as of the last `refresh_stage_stats` (zeros before)."""
        return self._stage_stats.get(stage, StageGauges())

    @functools.cached_property
    def tokenizer(self) -> Any:
        """The entry stage's tokenizer (and chat template)."""
        from omnistage.models.loader import load_tokenizer, resolve_model

        return load_tokenizer(resolve_model(self.entry_model))

    def count_prompt_tokens(self, prompt: str, has_media: bool = False) -> int:
        """The tokens the thinker receives for a rendered `prompt`, as its engine tokenizes
        it; with media, as the encoder does (no special tokens added), each placeholder
        counting as its marker tokens (the encoders' expansion happens in the stage)."""
        return len(self.tokenizer.encode(prompt, add_special_tokens=not has_media))

    # -- requests ----------------------------------------------------------------------------
    def render_chat(
        self, messages: list[dict[str, Any]], chat_template_kwargs: Any = None
    ) -> ChatPrompt:
        """The pipeline prompt of `messages` as the prompt reader renders it
        (`render_request_chat`), with the tokens the thinker receives for it (see
        `count_prompt_tokens`). Blocks."""
        from omnistage.multimodal.request_chat import render_request_chat

        reader = self.omni._prompts
        own = self.entry_builds_its_prompt
        chat = render_request_chat(
            None if own else self.tokenizer,
            messages,
            chat_template_kwargs=chat_template_kwargs,
            own_prompt=own,
            config=reader._path,
            supported=reader.input_modalities,
        )
        has_media = bool(chat.audios or chat.images)
        prompt: dict[str, Any] = {"prompt": chat.prompt}
        if has_media:
            prompt["multi_modal_data"] = {"audio": chat.audios, "image": chat.images}
        return ChatPrompt(prompt, self.count_prompt_tokens(chat.prompt, has_media))

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
    ) -> PipelineStream:
        """`EngineClient.add_request`: `params` go to the entry stage (with a seed, every other
        sampling stage gets its defaults with that seed: a seeded request is reproducible end
        to end), `draw` (`DiffusionParams`) to the draw stage. The prompt must fit the thinker's
        context with room for one token, and for `max_tokens` unless clamped. Returns once the
        pipeline took the request (its first update): bad input is a ValueError."""
        arrival = time.monotonic()
        if not self.is_alive:
            raise EngineDeadError("the pipeline is not running")
        if isinstance(prompt, ChatPrompt):
            num_prompt, prompt = prompt.num_tokens or 0, prompt.prompt
        elif isinstance(prompt, list):
            num_prompt, prompt = len(prompt), {"prompt_token_ids": prompt}
        else:
            num_prompt = await asyncio.to_thread(self.count_prompt_tokens, prompt)
        room = check_context(self.max_model_len, num_prompt, params.max_tokens, clamp_max_tokens)
        if clamp_max_tokens and room is not None and (params.max_tokens or room) > room:
            params = params.clone(max_tokens=room)
        per_stage = stage_params(self.deploy, params, draw)  # `plan_chat`: image asked for
        updates = self._updates(prompt, per_stage, modalities, request_id, voice)
        first = await anext(updates)  # validation runs here, before anything starts
        text, audio, image = (self.final_stage(m) for m in ("text", "audio", "image"))
        return PipelineStream(
            request_id,
            updates,
            first,
            num_prompt,
            text and text.name,
            audio.name if audio is not None and "audio" in modalities else None,
            self.omni.orchestrator.abort,
            self.observer,
            arrival,
            image.name if image is not None and "image" in modalities else None,
        )

    async def generate(
        self,
        prompt: Any,
        sampling_params: Any,
        modalities: Sequence[str] | None,
        request_id: str,
        renames: Mapping[str, str] | None = None,
        voice: str | None = None,
        **speech: str | None,
    ) -> AsyncIterator[OmniRequestOutput]:
        """The request's updates (the speech and image endpoints read them). Bad input is a
        400 naming the field (`renames`: engine names to the request's) at the first
        `anext`; then as `_updates`. `voice`: see `check_voice` (None: the default);
        `speech`: `instructions`, `language` for a TTS model (`Omni.generate`)."""
        updates = self._updates(prompt, sampling_params, modalities, request_id, voice, speech)
        try:
            try:
                first = await anext(updates)
            except ValueError as exc:
                raise OpenAIError.from_value_error(exc, renames) from None
            except EngineDeadError as exc:
                raise OpenAIError(str(exc), HTTPStatus.SERVICE_UNAVAILABLE) from None
            yield first
            async for output in updates:
                yield output
        finally:
            with contextlib.suppress(Exception):
                await updates.aclose()

    async def _updates(
        self,
        prompt: Any,
        sampling_params: Any,
        modalities: Sequence[str] | None,
        request_id: str,
        voice: str | None,
        speech: Mapping[str, str | None] | None = None,
    ) -> AsyncIterator[OmniRequestOutput]:
        """The updates of one request; ValueError for bad input at the first, OpenAIError
        (503, 500) for a request that failed, EngineDeadError when nothing runs."""
        if not self.is_alive:
            raise EngineDeadError("the pipeline is not running")
        updates = self.omni.generate(
            prompt, sampling_params, modalities, request_id, voice=voice, **(speech or {})
        )
        self._active.add(request_id)
        try:
            first = True
            async for output in updates:
                if output.finished and (output.error or output.aborted):
                    raise self._failure(output, first)
                first = False
                yield output
                if output.finished:
                    return
        finally:
            self._active.discard(request_id)
            with contextlib.suppress(Exception):
                await updates.aclose()  # aborts the request if it has not finished

    def _failure(self, output: OmniRequestOutput, first: bool) -> Exception:
        """Why a request ended without an answer: the entry stage refusing its input before
        it produced anything is the client's error (a ValueError naming the field, as a text
        model's engine refuses it); a shutdown or a stage that is not up a 503; anything
        else (a stage's step failed) a 500. The message names the stage."""
        if output.aborted or self._stopping:
            return OpenAIError(
                "the request was aborted: the server is shutting down",
                HTTPStatus.SERVICE_UNAVAILABLE,
            )
        if output.unavailable:  # a stage it needs died, hung or is restarting: try later
            return OpenAIError(
                f"the pipeline cannot serve this request now: {output.error}",
                HTTPStatus.SERVICE_UNAVAILABLE,
            )
        (entry,) = self.deploy.entry_stages
        refused = _REFUSED.match(output.error or "")
        if first and refused and refused.group(1) == entry.name:
            return ValueError(refused.group(2))
        return OpenAIError(f"the pipeline failed: {output.error}", HTTPStatus.INTERNAL_SERVER_ERROR)
