"""`omnistage verify` on a pipeline: the orchestrator (`Omni`) built in-process, once
per configuration, every stage's output and every payload recorded.

Configurations: every `ar` stage synchronous (`sync`; also `alone`: the same pipeline,
each request by itself), every `ar` stage asynchronous with its runner on a worker
thread (`async`), and `async` plus n-gram speculation on every `ar` stage whose model
takes drafts (`spec`; `draft_stages` finds them on the built `sync` pipeline: a model
that samples extra codes per token takes none). Generation and diffusion stages run
alike in all of them.

Each request is submitted with every stage as a final stage, so its output carries
each stage's tokens and data; every payload a stage's connector hands it is digested
as it is received (`PayloadRecorder`). An aborted request is aborted once the entry
stage has written `abort_after` tokens. The leak check waits (up to `IDLE_TIMEOUT_S`)
for every stage's counters, the orchestrator's open requests and the pipeline's
shared-memory segments to be back at zero.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from omnistage.entrypoints.verify.payloads import Kept, keep
from omnistage.entrypoints.verify.results import RunResult, StageTrace, digest
from omnistage.entrypoints.verify.text_runs import SPECULATIVE
from omnistage.entrypoints.verify.workload import VerifyRequest

IDLE_TIMEOUT_S = 10.0
WAIT_S = 600.0
SHM_DIR = "/dev/shm"
PROMPT_WORDS = 6
"""A pipeline's prompts keep their first 6 words (a diffusion stage's text encoder
takes few tokens: demo-image's 128)."""
SPOKEN_WORDS = 2
"""A text-to-speech entry (it builds its own prompt) speaks its first 2 words: its model
sets the speech budget from the text (CosyVoice3: up to 20 speech tokens per text token,
each stream chunk re-running the flow over the utterance so far), not `max_tokens`."""


def mode_spec(spec: Any, config: str, drafts: set[str], dtype: str | None) -> Any:
    """The deploy `spec` with `config`'s engine args on each `ar` stage (and `dtype` on
    every stage, when given)."""
    is_async = config in ("async", "spec")
    stages = []
    for stage in spec.stages:
        args = dict(stage.engine_args)
        if dtype is not None:
            args["dtype"] = dtype
        if stage.kind == "ar":
            args["async_scheduling"] = is_async
            args["executor_backend"] = "thread" if is_async else "inline"
            args.pop("speculative_config", None)
            if config == "spec" and stage.name in drafts:
                args["speculative_config"] = dict(SPECULATIVE)
        stages.append(dataclasses.replace(stage, engine_args=args))
    return dataclasses.replace(spec, stages=tuple(stages))


class PayloadRecorder:
    """Keeps every payload a stage's connector hands it: `got[request id][edge#chunk]`
    (`payloads.keep`)."""

    def __init__(self, omni: Any) -> None:
        self.got: dict[str, dict[str, Kept]] = {}
        for client in omni.orchestrator.clients.values():
            for connector in client.core.connectors.values():
                self._wrap(connector)

    def _wrap(self, connector: Any) -> None:
        get = connector.get

        def recording_get(handle: Any, timeout: float | None = None) -> Any:
            payload = get(handle, timeout)
            rid, edge, chunk = handle.key.rsplit("/", 2)
            self.got.setdefault(rid, {})[f"{edge}#{chunk}"] = keep(payload)
            return payload

        connector.get = recording_get


@contextmanager
def pipeline(spec: Any, config: str, drafts: set[str], dtype: str | None) -> Iterator[Any]:
    """The pipeline of one configuration, in this process; yields (omni, recorder)."""
    from omnistage.pipeline.omni import Omni

    with Omni(mode_spec(spec, config, drafts, dtype), in_process=True) as omni:
        yield omni, PayloadRecorder(omni)


def draft_stages(omni: Any) -> tuple[set[str], set[str]]:
    """(`ar` stages whose model takes drafts, `ar` stages whose model does not)."""
    takes, refuses = set(), set()
    for stage in omni.deploy.stages:
        if stage.kind != "ar":
            continue
        executor = omni.orchestrator.clients[stage.name].core.engine.core.executor
        model = getattr(getattr(executor, "runner", None), "model", None)
        (refuses if getattr(model, "num_token_codes", 0) else takes).add(stage.name)
    return takes, refuses


def stage_params(spec: Any, request: VerifyRequest) -> dict[str, Any]:
    """Each stage's parameters: its deploy defaults with the request's seed (every stage
    that samples is seeded), the request's temperature on the entry stage, and its
    `max_tokens` as a cap on every `ar` stage but one whose text becomes the next
    stage's prompt (demo-image's thinker must finish its caption)."""
    from omnistage.diffusion.params import DiffusionParams
    from omnistage.sampling_params import SamplingParams

    (entry,) = spec.entry_stages
    params: dict[str, Any] = {}
    for stage in spec.stages:
        fields = dict(stage.default_sampling) | {"seed": request.seed}
        if stage.kind == "diffusion":
            params[stage.name] = DiffusionParams.from_fields(fields)
        elif stage.kind == "ar":
            if stage.name == entry.name:
                fields["temperature"] = request.temperature
            if not any(e.transfer == "prompt" for e in spec.edges_from(stage.name)):
                budget = fields.get("max_tokens") or request.max_tokens
                fields["max_tokens"] = min(budget, request.max_tokens)
            params[stage.name] = SamplingParams(**fields)
    return params


def entry_prompt(spec: Any, text: str) -> str:
    """The entry stage's prompt: a chat rendered with its model's template, or the text
    as it is where the stage renders its prompt itself or a diffusion stage draws it (as
    `/v1/images/generations` sends it)."""
    from omnistage.entrypoints.entry_prompt import entry_builds_its_prompt
    from omnistage.models.loader import load_tokenizer, resolve_model

    if entry_builds_its_prompt(spec):
        return " ".join(text.split()[:SPOKEN_WORDS])
    text = " ".join(text.split()[:PROMPT_WORDS])
    if any(s.kind == "diffusion" for s in spec.stages):
        return text  # a diffusion stage draws the request's prompt: the user's words
    (entry,) = spec.entry_stages
    tokenizer = load_tokenizer(resolve_model(entry.with_part_directory().model))
    if getattr(tokenizer, "chat_template", None) is None:
        return text
    messages = [{"role": "user", "content": text}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def run_batched(
    omni: Any, recorder: PayloadRecorder, config: str, requests: list[VerifyRequest]
) -> RunResult:
    """Every request at once; the aborted ones ended after `abort_after` entry tokens."""
    result = RunResult(config, stages=list(omni.deploy.topological_order()))
    _run(omni, recorder, requests, result)
    return result


def run_alone(omni: Any, recorder: PayloadRecorder, requests: list[VerifyRequest]) -> RunResult:
    """Each request not aborted in the workload, by itself."""
    result = RunResult("alone", stages=list(omni.deploy.topological_order()))
    for request in requests:
        if request.abort_after is None:
            _run(omni, recorder, [request], result)
    result.aborted = {r.key for r in requests if r.abort_after is not None}
    return result


def _run(
    omni: Any, recorder: PayloadRecorder, requests: list[VerifyRequest], result: RunResult
) -> None:
    spec = omni.deploy
    (entry,) = spec.entry_stages
    stages = list(spec.topological_order())
    by_key = {r.key: r for r in requests}
    built = []
    for r in requests:
        built.append(omni.build_request(entry_prompt(spec, r.prompt), stage_params(spec, r), r.key))
        built[-1].final_stages = stages
    finished: queue.SimpleQueue[Any] = queue.SimpleQueue()
    aborting: set[str] = set()

    def sink(output: Any) -> None:
        after = by_key[output.request_id].abort_after
        if output.finished:
            finished.put(output)
        elif after is not None and output.request_id not in aborting:
            written = output.outputs.get(entry.name)
            if written is not None and len(written.token_ids) >= after:
                aborting.add(output.request_id)
                omni.orchestrator.abort(output.request_id)

    recorder.got.clear()
    omni.orchestrator.submit_batch(built, sink)
    for _ in requests:
        _record(finished.get(timeout=WAIT_S), result, aborting)
    for key, payloads in recorder.got.items():
        if key in result.traces:
            result.payloads[key] = dict(payloads)
    result.leaks |= pipeline_leaks(omni)


def _record(output: Any, result: RunResult, aborting: set[str]) -> None:
    key = output.request_id
    if key in aborting or output.aborted:
        result.aborted.add(key)
        return
    traces = {}
    for name, stage in output.outputs.items():
        data = stage.data
        traces[name] = StageTrace(
            list(stage.token_ids),
            stage.finish_reason,
            None if data is None else digest(data),
            output.error,
            _floats(data),
        )
    result.traces[key] = traces


def _floats(data: Any) -> Any:
    """A float tensor copy of float output data (`StageTrace.floats`), else None."""
    import numpy as np
    import torch

    if data is None:
        return None
    tensor = data if isinstance(data, torch.Tensor) else torch.as_tensor(np.asarray(data))
    return tensor.detach().cpu().clone() if tensor.is_floating_point() else None


def pipeline_leaks(omni: Any) -> dict[str, float]:
    """What the pipeline still holds once idle: each stage's counters, the orchestrator's
    open requests, its shared-memory segments (empty: nothing leaked)."""
    prefix = f"omni_{omni.orchestrator.namespace}_"
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while True:
        held = {
            f"{stage}.{name}": value
            for stage, counters in omni.stage_counters().items()
            for name, value in counters.items()
            if value
        }
        if omni.orchestrator.num_tracked():
            held["orchestrator.open_requests"] = omni.orchestrator.num_tracked()
        segments = sum(1 for n in os.listdir(SHM_DIR) if n.startswith(prefix))
        if segments:
            held["shm_segments"] = segments
        if not held or time.monotonic() > deadline:
            return held
        time.sleep(0.05)
