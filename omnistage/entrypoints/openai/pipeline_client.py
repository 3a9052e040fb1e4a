"""`PipelineClient`: a multi-stage pipeline (`AsyncOmni`) behind the OpenAI server.

`omnistage serve` serves a model whose deploy has more than one stage (the
built-in `demo-image` / `demo-omni`, an omni or image checkpoint, or `--deploy
FILE|NAME`) through this client instead of `AsyncEngineClient`. It offers the
part of `AsyncEngineClient`'s surface the app itself uses (`start`, `shutdown`,
`begin_shutdown`, `is_alive`, `max_model_len`) plus `generate`, which streams a
request's `OmniRequestOutput` updates and aborts the request in every stage when
the caller stops listening (a client that disconnects, a shutdown).

What the pipeline can answer follows from its deploy: `draws` (a final stage
with `final_output_type: image`) enables POST /v1/images/generations, `speaks`
(`final_output_type: audio`) POST /v1/audio/speech.

`max_model_len` is the entry (thinker) stage's context length, resolved from the
deploy as its engine will resolve it (the stage's `engine_args.max_model_len`, else
the model part's own), without asking the stage processes; `count_prompt_tokens`
counts a prompt as the thinker's tokenizer will. `refresh_stage_stats` asks every
stage for its scheduler gauges (queue depth, KV cache use); `stage_stats` reads the
last answer (what /metrics exports per stage).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from omnistage.entrypoints.openai.errors import OpenAIError
from omnistage.pipeline.deploy_spec import DeploySpec, StageSpec
from omnistage.pipeline.omni import AsyncOmni
from omnistage.pipeline.outputs import OmniRequestOutput

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StageGauges:
    """One stage's scheduler state as its last stats reply gave it (metrics read it)."""

    num_waiting: int = 0
    """Requests waiting for input or to be scheduled."""
    num_running: int = 0
    """Requests being computed."""
    kv_cache_usage: float = 0.0
    """Fraction of the stage's KV cache blocks in use (0 for stages without one)."""


def pipeline_deploy(
    model: str | None, deploy: str | os.PathLike | Mapping[str, Any] | DeploySpec | None
) -> DeploySpec | None:
    """The multi-stage deploy `omnistage serve` should run for `model` / `deploy`, or None
    when it is one text model (served by `AsyncEngineClient` as before)."""
    from omnistage.pipeline.deploy import deploy_for_model, load_deploy
    from omnistage.pipeline.omni import _deploy_source

    if deploy is not None:
        spec = deploy if isinstance(deploy, DeploySpec) else load_deploy(_deploy_source(deploy))
        return spec.with_model(model) if model is not None else spec
    if model is None:
        return None
    spec = deploy_for_model(model)
    return spec if len(spec.stages) > 1 else None


class PipelineClient:
    """An `AsyncOmni` driven by the server (the app starts nothing: the stages start here)."""

    stage = "pipeline"

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
    def other_endpoints(self) -> str:
        """The generating endpoints a pipeline without text answers (for its 400s)."""
        served = [
            path
            for path, ok in (
                ("/v1/images/generations", self.draws),
                ("/v1/audio/speech", self.speaks),
            )
            if ok
        ]
        return ", ".join(served) or "no generating endpoint"

    @property
    def diffusion_limits(self):
        """The draw stage's `DiffusionLimits` (sizes it can draw), or None."""
        stage = self.final_stage("image")
        return None if stage is None else self.omni._params.limits.get(stage.name)

    @functools.cached_property
    def voices(self) -> list[str] | None:
        """The speakers of the pipeline's talker checkpoint (`voices.speakers_of`), or None
        when it has no talker to choose a speaker of."""
        from omnistage.pipeline.voices import speakers_of

        return speakers_of(self.deploy)

    @property
    def default_voice(self) -> str | None:
        from omnistage.pipeline.voices import default_voice

        voice = default_voice(self.deploy)
        if voice is not None:
            return voice
        return "default" if self.speaks else None

    def check_voice(self, voice: str | None, param: str) -> str | None:
        """The request's `voice` as the pipeline takes it (`generate(voice=...)`): one of
        `voices` (any case), None for None or a pipeline without voices to choose from
        given its default; any other is a 400 naming `param` with the choices."""
        if voice is None:
            return None
        choices = self.voices
        if choices is None:
            default = self.default_voice
            if default is not None and voice.lower() == default.lower():
                return None
            raise OpenAIError(
                f"{param}: {voice!r} is not available; this model speaks only with its "
                f"default voice {default!r}",
                param=param,
            )
        by_lower = {c.lower(): c for c in choices}
        if voice.lower() not in by_lower:
            raise OpenAIError(
                f"{param}: {voice!r} is not one of {', '.join(sorted(by_lower))}", param=param
            )
        return by_lower[voice.lower()]

    @property
    def entry_model(self) -> str | None:
        (entry,) = self.deploy.entry_stages
        return entry.with_part_directory().model

    @functools.cached_property
    def entry_builds_its_prompt(self) -> bool:
        """Whether the entry stage renders its prompt itself (GLM-Image's prior states the
        image size in its prompt): requests then pass the text as it is, not as a chat."""
        from omnistage.entrypoints.cli import _entry_builds_its_prompt

        return _entry_builds_its_prompt(self.deploy)

    # -- lifecycle (the app's lifespan, `Server`) ----------------------------------------------
    @property
    def is_alive(self) -> bool:
        orchestrator = self.omni.orchestrator
        return (
            not self._stopping
            and not self._closed
            and orchestrator._thread.is_alive()
            and not orchestrator.dead
        )

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
            gauges = reply.gauges
            self._stage_stats[name] = StageGauges(
                num_waiting=int(gauges.get("num_waiting", 0)),
                num_running=int(gauges.get("num_running", 0)),
                kv_cache_usage=float(gauges.get("kv_cache_usage", 0.0)),
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
    async def generate(
        self,
        prompt: Any,
        sampling_params: Any,
        modalities: Sequence[str] | None,
        request_id: str,
        renames: Mapping[str, str] | None = None,
        voice: str | None = None,
    ) -> AsyncIterator[OmniRequestOutput]:
        """The request's updates. Bad input is a 400 naming the field, raised at the first
        `anext` (before any response starts); a failed request a 503 (aborted by a shutdown)
        or 500 (a stage failed). Leaving early aborts the request in every stage. `voice`:
        the talker's speaker (see `check_voice`; None: the model's default)."""
        if not self.is_alive:
            raise OpenAIError("the pipeline is not running", HTTPStatus.SERVICE_UNAVAILABLE)
        updates = self.omni.generate(prompt, sampling_params, modalities, request_id, voice=voice)
        self._active.add(request_id)
        try:
            try:
                output = await anext(updates)  # validation runs here, before anything starts
            except ValueError as exc:
                raise OpenAIError.from_value_error(exc, renames) from None
            while True:
                if output.finished and (output.error or output.aborted):
                    if output.aborted or self._stopping:
                        raise OpenAIError(
                            "the request was aborted: the server is shutting down",
                            HTTPStatus.SERVICE_UNAVAILABLE,
                        )
                    raise OpenAIError(
                        f"the pipeline failed: {output.error}", HTTPStatus.INTERNAL_SERVER_ERROR
                    )
                yield output
                if output.finished:
                    return
                output = await anext(updates)
        finally:
            self._active.discard(request_id)
            with contextlib.suppress(Exception):
                await updates.aclose()  # aborts the request if it has not finished


def entry_max_model_len(entry: StageSpec) -> int | None:
    """The context length an `ar` stage's engine will have (`EngineConfig.resolve_for_model`
    over its checkpoint part's config), read from configuration only; None for other kinds
    or a stage without a model."""
    if entry.kind != "ar" or entry.model is None:
        return None
    from omnistage.config import EngineConfig
    from omnistage.engine.builder import model_max_len
    from omnistage.models.loader import load_hf_config, resolve_model
    from omnistage.models.parts import select_part
    from omnistage.models.registry import engine_config

    spec = entry.with_part_directory()
    hf_config = load_hf_config(resolve_model(spec.model))
    if spec.model_part is not None:
        hf_config = select_part(hf_config, spec.model_part)
    hf_config = engine_config(hf_config)
    configured = spec.engine_args.get("max_model_len")
    config = EngineConfig(model=spec.model, max_model_len=configured)
    return config.resolve_for_model(model_max_len(hf_config)).max_model_len
