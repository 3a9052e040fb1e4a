"""`RequestRouter`: where each pipeline request goes in the graph, and how it ends.

The entry stage gets a request at once; a consumer behind a `payload` or
`stream` edge is submitted when the first payload handle for it arrives (it
then waits in its coordinator for the rest), and one behind a `prompt` edge
when its producer has finished. Payload *handles* are forwarded; the data
moves between stages through connectors.

Each stage output is added to the request's `StageResult`s (append-only) and
handed on as an update carrying what is new plus O(1) snapshots of the final
stages' results. A request ends when every final stage it asked for has
finished, when any stage fails it (bad input, input timeout, a failed step),
when a stage it needs dies, hangs or is restarting (`stage_down`: the request is
`unavailable`, a 503), or when it is aborted; then every stage that saw it is
told to drop it. The orchestrator's thread calls every method here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from omnistage.core.edge_processor import UpstreamResult
from omnistage.core.tensor_blob import TensorBlob, blob_to_tensor
from omnistage.pipeline.deploy import DeploySpec
from omnistage.pipeline.messages import (
    AbortRequest,
    DeliverPayload,
    PayloadReady,
    RequestFailed,
    StageOutput,
    SubmitRequest,
)
from omnistage.pipeline.outputs import OmniRequestOutput, StageResult
from omnistage.pipeline.processors import get_processor
from omnistage.pipeline.stage_core import edge_name
from omnistage.pipeline.stage_set import StageSet

logger = logging.getLogger(__name__)
Sink = Callable[[OmniRequestOutput], None]


@dataclass
class PipelineRequest:
    """A request as the frontend submits it (prompt checked, per-stage parameters resolved)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | None
    sampling: dict[str, dict[str, Any]]
    """Per stage name: SamplingParams fields (stages not named use their defaults)."""
    final_stages: list[str]
    audios: list[TensorBlob] = field(default_factory=list)
    """Decoded audio clips of the prompt (for the entry stage's encoders)."""
    images: list[TensorBlob] = field(default_factory=list)
    """Decoded images of the prompt."""
    image_size: list[int] | None = None
    """`[height, width]` of the image a diffusion stage will draw (see `SubmitRequest`)."""
    voice: str | None = None
    """The speaker a speaking pipeline's talker speaks with (see `SubmitRequest`)."""
    instructions: str | None = None
    """How a TTS talker speaks (see `SubmitRequest`)."""
    language: str | None = None
    """The language a TTS talker speaks (see `SubmitRequest`)."""


@dataclass
class _Tracked:
    """A request in flight: the stages it needs, has started and has finished there, and
    its results so far."""

    request: PipelineRequest
    sink: Sink
    needed: set[str]
    results: dict[str, StageResult]
    started: set[str] = field(default_factory=set)
    done: set[str] = field(default_factory=set)


class RequestRouter:
    def __init__(self, deploy: DeploySpec, stages: StageSet) -> None:
        self.deploy = deploy
        self.stages = stages
        self.sample_rates = stages.sample_rates
        self.tracked: dict[str, _Tracked] = {}
        self.dead: dict[str, str] = {}
        """Stages that are not up (restarting or down), with the reason their requests
        fail with."""

    def on_failed(self, event: RequestFailed) -> None:
        """A stage failed one request (bad input, input timeout): end it with the reason."""
        tracked = self.tracked.get(event.request_id)
        if tracked is not None:
            self.end(tracked, error=f"stage {event.stage}: {event.message}")

    def fail_all(self, reason: str) -> None:
        """End every request in flight with `reason` (shutdown, orchestrator failure)."""
        for tracked in list(self.tracked.values()):
            self.end(tracked, error=reason)

    def stage_down(self, name: str, reason: str) -> None:
        """Stage `name` died, hung or is restarting: fail the requests that still need it,
        now and when they arrive, with `reason` (a 503: `unavailable`), and unlink their
        shared-memory payloads (sent to or by the dead stage, they have no reader left).

        `name` may be one replica of a replicated stage (`talker#1`): then only the
        requests it served fail (its TCP payloads died with it, so even those it had
        finished), and new ones go to the other replicas; the stage is down only when
        all its replicas are."""
        stage = self.stages.stage_of(name)
        balancer = self.stages.balancer
        lost = set(balancer.down(name)) if balancer.replicated(stage) else set()
        if not balancer.replicated(stage) or not balancer.any_live(stage):
            self.dead[stage] = reason
        for tracked in list(self.tracked.values()):
            rid = tracked.request.request_id
            if rid in lost or (
                stage in self.dead and stage in tracked.needed and stage not in tracked.done
            ):
                self.end(tracked, error=reason, unavailable=True)
                self.stages.release_request(rid)

    def stage_up(self, name: str) -> None:
        """Stage (or replica) `name` serves again: requests that need it start as usual."""
        self.stages.balancer.up(name)
        self.dead.pop(self.stages.stage_of(name), None)

    def start(self, request: PipelineRequest, sink: Sink) -> None:
        """Track a request and submit it to the entry stage; `sink` gets its outputs."""
        needed = self._needed_stages(request.final_stages)
        results = {
            s: StageResult(
                s, self.deploy.stage(s).final_output_type, sample_rate=self.sample_rates.get(s)
            )
            for s in needed
        }
        tracked = _Tracked(request, sink, needed, results)
        if request.request_id in self.tracked:
            sink(
                OmniRequestOutput(
                    request.request_id,
                    {},
                    True,
                    f"request_id: {request.request_id!r} is already in use",
                )
            )
            return
        self.tracked[request.request_id] = tracked
        dead = sorted(s for s in needed if s in self.dead)
        if dead:
            self.end(tracked, error=self.dead[dead[0]], unavailable=True)
            return
        (entry,) = self.deploy.entry_stages
        self._submit(
            tracked,
            entry.name,
            SubmitRequest(
                request_id=request.request_id,
                prompt=request.prompt,
                prompt_token_ids=request.prompt_token_ids,
                audios=request.audios,
                images=request.images,
                image_size=request.image_size,
            ),
        )

    def _needed_stages(self, finals: list[str]) -> set[str]:
        needed, todo = set(), list(finals)
        while todo:
            name = todo.pop()
            if name not in needed:
                needed.add(name)
                todo += [e.src for e in self.deploy.edges_into(name)]
        return needed

    def _submit(self, tracked: _Tracked, stage: str, msg: SubmitRequest) -> None:
        msg.sampling = tracked.request.sampling.get(stage)
        msg.voice = tracked.request.voice
        msg.instructions = tracked.request.instructions
        msg.language = tracked.request.language
        msg.modalities = sorted(
            {str(self.deploy.stage(s).final_output_type) for s in tracked.request.final_stages}
        )
        msg.send_to = [
            edge_name(e)
            for e in self.deploy.edges_from(stage)
            if e.transfer != "prompt" and e.dst in tracked.needed
        ]
        tracked.started.add(stage)
        self.stages.send(stage, msg)

    def on_output(self, event: StageOutput) -> None:
        """Add a stage's step output to the request's result; pass the update on, start
        the consumers of its prompt edges when it finished, end the request when all its
        final stages have."""
        tracked = self.tracked.get(event.request_id)
        if tracked is None or event.stage not in tracked.results:
            return
        result = tracked.results[event.stage]
        data = None if event.data is None else blob_to_tensor(event.data)
        result.add(event.new_token_ids, event.new_text, data)
        if event.num_prompt_tokens is not None:
            result.num_prompt_tokens = event.num_prompt_tokens
        if event.finished:
            result.finished, result.finish_reason = True, event.finish_reason
            tracked.done.add(event.stage)
            self._submit_prompt_edges(tracked, event.stage, result)
        finals = tracked.request.final_stages
        update = OmniRequestOutput(
            tracked.request.request_id,
            {},
            stage=event.stage,
            new_text=event.new_text,
            new_token_ids=event.new_token_ids,
            new_data=data,
            progress=None if event.progress is None else tuple(event.progress),
        )
        if all(s in tracked.done for s in finals):
            self.end(tracked, update=update)  # the final output also brings the last piece
        elif event.stage in finals:
            update.outputs = _snapshot(tracked, finals)
            _emit(tracked.sink, update)

    def _submit_prompt_edges(self, tracked: _Tracked, stage: str, result: StageResult) -> None:
        for edge in self.deploy.edges_from(stage):
            if edge.transfer != "prompt" or edge.dst not in tracked.needed:
                continue
            upstream = UpstreamResult(
                text=result.text,
                prompt_token_ids=list(tracked.request.prompt_token_ids or []),
                output_token_ids=result.token_ids,
                producer_model=self.deploy.stage(stage).with_part_directory().model,
            )
            try:
                inputs = get_processor(edge.processor).to_prompt(upstream)
            except ValueError as exc:  # e.g. a thinker that wrote no caption: fail the request
                self.end(tracked, error=f"stage {edge.dst!r}: {exc}")
                return
            self._submit(
                tracked,
                edge.dst,
                SubmitRequest(
                    request_id=tracked.request.request_id,
                    prompt=inputs.prompt,
                    prompt_token_ids=inputs.prompt_token_ids,
                ),
            )

    def on_payload(self, event: PayloadReady) -> None:
        """Forward a payload handle to its consumer (submitting the request there first)."""
        consumer = event.edge.split("->", 1)[1]
        if consumer in self.dead:  # its request failed; the producer's abort frees the payload
            return
        tracked = self.tracked.get(event.request_id)
        if tracked is not None and consumer not in tracked.started:
            # A diffusion stage draws the user's prompt with what the producer sent.
            draws = self.deploy.stage(consumer).kind == "diffusion"
            self._submit(
                tracked,
                consumer,
                SubmitRequest(
                    request_id=event.request_id,
                    wait_for=[event.edge],
                    prompt=tracked.request.prompt if draws else None,
                ),
            )
        # Forwarded even for an ended request: the consumer is then not waiting and frees it.
        self.stages.send(
            consumer,
            DeliverPayload(
                request_id=event.request_id,
                edge=event.edge,
                handle=event.handle,
                chunk_index=event.chunk_index,
                last=event.last,
            ),
        )

    def abort(self, request_id: str) -> None:
        """End a request as aborted (unknown or ended ids are ignored)."""
        tracked = self.tracked.get(request_id)
        if tracked is not None:
            self.end(tracked, aborted=True)

    def end(
        self,
        tracked: _Tracked,
        error: str | None = None,
        aborted: bool = False,
        update: OmniRequestOutput | None = None,
        unavailable: bool = False,
    ) -> None:
        """End a request once: after an error or an abort every live stage that saw it drops
        it (one that finished it too: a producer may still hold its payloads), and its sink
        gets the final output."""
        request_id = tracked.request.request_id
        if self.tracked.pop(request_id, None) is None:
            return
        if error is not None or aborted:
            for stage in tracked.started:
                if stage not in self.dead:
                    self.stages.send(stage, AbortRequest(request_id=request_id))
        self.stages.balancer.forget(request_id)
        final = update or OmniRequestOutput(request_id, {})
        final.outputs = _snapshot(tracked, tracked.request.final_stages)
        final.finished, final.error, final.aborted = True, error, aborted
        final.unavailable = unavailable
        _emit(tracked.sink, final)


def _snapshot(tracked: _Tracked, stages: list[str]) -> dict[str, StageResult]:
    """The results as they are now (O(1) each): the caller's thread reads them while this one
    goes on appending."""
    return {s: tracked.results[s].snapshot() for s in stages}


def _emit(sink: Sink, output: OmniRequestOutput) -> None:
    """Hand an output to its caller; a caller that went away must not stop the pipeline."""
    try:
        sink(output)
    except Exception:
        logger.exception("delivering an output of request %s", output.request_id)
