"""`Omni` (offline) and `AsyncOmni` (asyncio, streaming): the pipeline's frontends.

Both read a deploy file (or make the one-stage pipeline of `model=`), start
the orchestrator with every stage in its own process (or all in this process
with `in_process=True`), validate requests before anything runs, and hand
outputs back: `Omni.generate` the final outputs of a batch of prompts,
`AsyncOmni.generate` an async stream of per-request updates.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import os
import queue
import secrets
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from omnistage.child import exit_on_sigterm
from omnistage.config import DEFAULT_MODEL
from omnistage.core.tensor_blob import tensor_to_blob
from omnistage.pipeline.deploy import (
    DeploySpec,
    check_stage_models,
    deploy_for_model,
    load_deploy,
)
from omnistage.pipeline.orchestrator import Orchestrator, PipelineRequest
from omnistage.pipeline.outputs import OmniRequestOutput
from omnistage.pipeline.prompt_inputs import PromptReader
from omnistage.pipeline.stage_params import SamplingArg, StageParamsReader
from omnistage.pipeline.voices import resolve_voice

PipelinePrompt = str | Mapping[str, Any]
WAIT_SLICE_S = 0.1


class _PipelineFrontend:
    def __init__(
        self,
        deploy: str | os.PathLike | Mapping[str, Any] | DeploySpec | None = None,
        model: str | None = None,
        *,
        in_process: bool = False,
        **engine_args: Any,
    ) -> None:
        if deploy is None:
            spec = deploy_for_model(model or DEFAULT_MODEL, engine_args)
        else:
            if engine_args:
                raise ValueError(
                    f"{next(iter(engine_args))}: engine arguments go in the deploy file's "
                    "engine_args when a deploy file is given"
                )
            spec = deploy if isinstance(deploy, DeploySpec) else load_deploy(_deploy_source(deploy))
            if model is not None:
                spec = spec.with_model(model)
        check_stage_models(spec)
        self.deploy = spec
        (entry,) = spec.entry_stages
        self._prompts = PromptReader(entry.with_part_directory().model)
        self._params = StageParamsReader(spec)
        self._ids = itertools.count()
        exit_on_sigterm()  # SIGTERM runs shutdown (atexit) instead of leaving stages behind
        self.orchestrator = Orchestrator(spec, secrets.token_hex(4), in_process=in_process)
        atexit.register(self.shutdown)

    @property
    def modalities(self) -> list[str]:
        return sorted({s.final_output_type for s in self.deploy.final_stages})

    def _request(
        self,
        prompt: PipelinePrompt,
        sampling_params: SamplingArg,
        modalities: Sequence[str] | None,
        request_id: str | None,
        voice: str | None = None,
        instructions: str | None = None,
        language: str | None = None,
    ) -> PipelineRequest:
        """Validate one request up front (decoding its media); ValueError naming the field.
        `voice`: one of the talker checkpoint's speakers, any case (`voices.resolve_voice`);
        `instructions`, `language`: for a TTS talker (checked by its prompter)."""
        voice = resolve_voice(self.deploy, voice)
        for name, value in (("instructions", instructions), ("language", language)):
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name}: expected a string, got {value!r}")
        inputs = self._prompts.read(prompt)
        wanted = list(modalities) if modalities is not None else self.modalities
        unknown = [m for m in wanted if m not in self.modalities]
        if not wanted or unknown:
            raise ValueError(
                f"modalities: {unknown[0] if unknown else 'none'!r} cannot be produced by this "
                f"pipeline; it produces {', '.join(self.modalities)}"
            )
        params = self._params.read(sampling_params, inputs.prompt)
        if request_id is not None and (not isinstance(request_id, str) or not request_id):
            raise ValueError("request_id: must be a non-empty string")
        return PipelineRequest(
            request_id=request_id or f"omni-{next(self._ids)}-{secrets.token_hex(4)}",
            prompt=inputs.prompt,
            prompt_token_ids=inputs.prompt_token_ids,
            audios=[tensor_to_blob(torch.from_numpy(a)) for a in inputs.audios],
            images=[tensor_to_blob(torch.from_numpy(i)) for i in inputs.images],
            sampling=params.per_stage,
            image_size=params.image_size,
            voice=voice,
            instructions=instructions,
            language=language,
            final_stages=[
                s.name for s in self.deploy.final_stages if s.final_output_type in wanted
            ],
        )

    def build_request(
        self, prompt: PipelinePrompt, sampling_params: SamplingArg, request_id: str
    ) -> PipelineRequest:
        """One request checked as `generate` checks it, for a caller that submits it to
        `self.orchestrator` itself (`omnistage verify`: to abort it mid-way, or to collect
        stages that are not final)."""
        return self._request(prompt, sampling_params, None, request_id)

    def stage_counters(self) -> dict[str, dict[str, int]]:
        """Resource counters of every stage (KV blocks, accumulator and coordinator entries,
        pending connector buffers); all zero when nothing is running."""
        return self.orchestrator.stats()

    def shutdown(self) -> None:
        atexit.unregister(self.shutdown)
        self.orchestrator.shutdown()

    def __enter__(self) -> _PipelineFrontend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


class Omni(_PipelineFrontend):
    """Offline pipeline: `generate` runs a batch of prompts to completion."""

    def generate(
        self,
        prompts: PipelinePrompt | Sequence[PipelinePrompt],
        sampling_params: SamplingArg | list[SamplingArg] = None,
        modalities: Sequence[str] | None = None,
        voice: str | None = None,
        instructions: str | None = None,
        language: str | None = None,
    ) -> list[OmniRequestOutput]:
        """Final outputs in prompt order; a request that failed has `error` set.
        `sampling_params` may be a list, one entry per prompt. `voice`: the speaker of a
        speaking pipeline (one of its talker checkpoint's, any case; None: the default),
        checked before any stage runs (ValueError naming `voice` with the choices).
        `instructions` (how to speak; a VoiceDesign model's voice in words) and
        `language` (None: "auto"): for TTS models (Qwen3-TTS)."""
        single = isinstance(prompts, str | Mapping)
        batch = [prompts] if single else list(prompts)
        if isinstance(sampling_params, list):  # one per prompt, as vLLM's LLM takes them
            if len(sampling_params) != len(batch):
                raise ValueError(
                    f"sampling_params: {len(sampling_params)} given for {len(batch)} prompts"
                )
            per_prompt = sampling_params
        else:
            per_prompt = [sampling_params] * len(batch)
        requests = [
            self._request(p, params, modalities, None, voice, instructions, language)
            for p, params in zip(batch, per_prompt, strict=True)
        ]
        finished: queue.SimpleQueue[OmniRequestOutput] = queue.SimpleQueue()

        def sink(output: OmniRequestOutput) -> None:
            if output.finished:
                finished.put(output)

        self.orchestrator.submit_batch(requests, sink)
        by_id: dict[str, OmniRequestOutput] = {}
        try:
            while len(by_id) < len(requests):
                try:  # a timed wait: Ctrl-C (KeyboardInterrupt) gets through between waits
                    output = finished.get(timeout=WAIT_SLICE_S)
                except queue.Empty:
                    continue
                by_id[output.request_id] = output
        except BaseException:  # interrupted: the stages stop working on this batch
            for r in requests:
                if r.request_id not in by_id:
                    self.orchestrator.abort(r.request_id)
            raise
        return [by_id[r.request_id] for r in requests]


class AsyncOmni(_PipelineFrontend):
    """asyncio pipeline: `generate` streams a request's updates; `abort` ends one."""

    async def generate(
        self,
        prompt: PipelinePrompt,
        sampling_params: SamplingArg = None,
        modalities: Sequence[str] | None = None,
        request_id: str | None = None,
        voice: str | None = None,
        instructions: str | None = None,
        language: str | None = None,
    ) -> AsyncIterator[OmniRequestOutput]:
        """`voice`, `instructions`, `language`: as `Omni.generate`'s."""
        request = self._request(
            prompt, sampling_params, modalities, request_id, voice, instructions, language
        )
        loop = asyncio.get_running_loop()
        updates: asyncio.Queue[OmniRequestOutput] = asyncio.Queue()

        def sink(output: OmniRequestOutput) -> None:
            with contextlib.suppress(RuntimeError):  # the caller's event loop is closed
                loop.call_soon_threadsafe(updates.put_nowait, output)

        self.orchestrator.submit(request, sink)
        finished = False
        try:
            while not finished:
                output = await updates.get()
                finished = output.finished
                yield output
        finally:
            if not finished:  # the caller stopped listening (or was cancelled): free it
                self.orchestrator.abort(request.request_id)

    async def abort(self, request_id: str) -> None:
        self.orchestrator.abort(request_id)


def _deploy_source(deploy: str | os.PathLike | Mapping[str, Any]) -> Any:
    """A path, a mapping, or the name of a deploy file shipped with the package."""
    if isinstance(deploy, str) and not Path(deploy).exists() and "/" not in deploy:
        from omnistage.pipeline.deploy import packaged_deploy_path

        return packaged_deploy_path(deploy.removesuffix(".yaml"))
    return deploy
