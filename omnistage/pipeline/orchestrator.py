"""`Orchestrator`: routes each request through the pipeline graph.

It runs in a thread of the frontend process. The entry stage gets the request
at once; a consumer behind a `payload` or `stream` edge is submitted when the
first payload handle for it arrives (it then waits in its coordinator for the
rest), and one behind a `prompt` edge when its producer has finished. The
orchestrator forwards payload *handles* only; the data moves between stages
through connectors.

A request ends when every final stage it asked for has finished, when any
stage fails it (bad input, input timeout), when a stage it needs crashes, or
when it is aborted; then every stage that saw it is told to drop it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import zmq

from omnistage.core.tensor_blob import TensorBlob, blob_to_tensor
from omnistage.pipeline.deploy import DeploySpec
from omnistage.pipeline.messages import (
    AbortRequest,
    DeliverPayload,
    FromStage,
    GetStats,
    PayloadReady,
    RequestFailed,
    StageFatal,
    StageOutput,
    StageStats,
    SubmitRequest,
)
from omnistage.pipeline.outputs import OmniRequestOutput, StageResult
from omnistage.pipeline.processors import UpstreamResult, get_processor
from omnistage.pipeline.stage_core import edge_name
from omnistage.pipeline.stage_process import StageClient
from omnistage.pipeline.stage_set import StageSet

logger = logging.getLogger(__name__)
Sink = Callable[[OmniRequestOutput], None]
IDLE_POLL_MS = 100
"""Longest sleep of an idle loop: stage deaths are noticed within this."""
STATS_ROUND_S = 5.0
"""A stats round unanswered this long (a stage died meanwhile) is asked again."""


@dataclass
class PipelineRequest:
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


@dataclass
class _Tracked:
    request: PipelineRequest
    sink: Sink
    needed: set[str]
    results: dict[str, StageResult]
    started: set[str] = field(default_factory=set)
    done: set[str] = field(default_factory=set)


class Orchestrator:
    def __init__(
        self,
        deploy: DeploySpec,
        namespace: str,
        in_process: bool = False,
        startup_timeout_s: float = 600.0,
    ) -> None:
        self.deploy = deploy
        self.namespace = namespace
        self.context = zmq.Context()
        self.dead: dict[str, str] = {}
        self.tracked: dict[str, _Tracked] = {}
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._stats: tuple[list[Future], dict[str, StageStats], float] | None = None
        """The stats round in flight: its waiters, the replies so far, when it began."""
        self._stopping = False
        try:
            self.stages = StageSet(deploy, namespace, self.context, in_process, startup_timeout_s)
        except BaseException:
            self.context.term()
            raise
        self.sample_rates = self.stages.sample_rates
        # Commands wake the loop through an inproc socket, so it can sleep in one poll.
        self._wake_in = self.context.socket(zmq.PULL)
        self._wake_in.bind(f"inproc://wake-{id(self)}")
        self._wake_out = self.context.socket(zmq.PUSH)
        self._wake_out.connect(f"inproc://wake-{id(self)}")
        self._wake_lock = threading.Lock()
        self._poller = zmq.Poller()
        self._poller.register(self.stages.inbox, zmq.POLLIN)
        self._poller.register(self._wake_in, zmq.POLLIN)
        self._thread = threading.Thread(
            target=self._run, name="omnistage-orchestrator", daemon=True
        )
        self._thread.start()

    @property
    def clients(self) -> dict[str, StageClient]:
        return self.stages.clients

    # -- frontend API (thread-safe) ---------------------------------------------------------
    def submit(self, request: PipelineRequest, sink: Sink) -> None:
        self.submit_batch([request], sink)

    def submit_batch(self, requests: list[PipelineRequest], sink: Sink) -> None:
        """Start requests together: they reach the entry stage before its next step, so a
        batch is scheduled the same way whatever the loop was doing."""
        if self._stopping or not self._thread.is_alive():
            for request in requests:
                sink(OmniRequestOutput(request.request_id, {}, True, "the pipeline is not running"))
            return

        def start() -> None:
            for request in requests:
                self._start(request, sink)

        self._command(start)

    def abort(self, request_id: str) -> None:
        self._command(lambda: self._abort(request_id))

    def _command(self, command: Callable[[], None]) -> None:
        self._commands.put(command)
        with self._wake_lock:
            if not self._stopping:
                self._wake_out.send(b"", zmq.NOBLOCK)

    def stats(self, timeout: float = 30.0) -> dict[str, dict[str, int]]:
        """Every stage's resource counters (for leak checks and metrics)."""
        return {name: s.counters for name, s in self.stage_stats(timeout).items()}

    def stage_stats(self, timeout: float = 30.0) -> dict[str, StageStats]:
        """Every live stage's `StageStats` (counters and scheduler gauges); blocks. Callers
        asking while a round is in flight share its answer."""
        future: Future = Future()
        self._command(lambda: self._ask_stats(future))
        return future.result(timeout)

    def num_tracked(self) -> int:
        return len(self.tracked)

    def shutdown(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        self._thread.join(30)
        for tracked in list(self.tracked.values()):
            self._end(tracked, error="the pipeline was shut down")
        self._close()

    def _close(self) -> None:
        self.stages.close()
        with self._wake_lock:
            self._wake_in.close(linger=0)
            self._wake_out.close(linger=0)
        self.context.term()

    # -- the loop --------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopping:
                while True:
                    try:
                        self._commands.get_nowait()()
                    except queue.Empty:
                        break
                busy = self.stages.busy()
                for event in self._poll_events(0 if busy else IDLE_POLL_MS):
                    self._route(event)
                self._check_stages()
        except Exception as exc:  # nothing may hang: fail everyone, loudly
            logger.exception("orchestrator failed")
            for tracked in list(self.tracked.values()):
                self._end(tracked, error=f"orchestrator failed: {exc}")

    def _poll_events(self, timeout_ms: int) -> list[FromStage]:
        events = self.stages.poll_clients()
        ready = dict(self._poller.poll(0 if events else timeout_ms))
        if self._wake_in in ready:
            while True:
                try:
                    self._wake_in.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
        if self.stages.inbox in ready:
            events += self.stages.drain_inbox()
        return events

    def _check_stages(self) -> None:
        for name, code in self.stages.exit_codes().items():
            if name not in self.dead:
                logger.error("%s", self.stages.clients[name].failure())
                self._stage_died(name, f"stage {name!r} died (exit code {code})")

    def _stage_died(self, name: str, reason: str) -> None:
        self.dead[name] = reason
        logger.error("%s", reason)
        for tracked in list(self.tracked.values()):
            if name in tracked.needed and name not in tracked.done:
                self._end(tracked, error=reason)

    # -- routing ------------------------------------------------------------------------------------
    def _route(self, event: FromStage) -> None:
        if isinstance(event, StageOutput):
            self._on_output(event)
        elif isinstance(event, PayloadReady):
            self._on_payload(event)
        elif isinstance(event, RequestFailed):
            tracked = self.tracked.get(event.request_id)
            if tracked is not None:
                self._end(tracked, error=f"stage {event.stage}: {event.message}")
        elif isinstance(event, StageStats):
            self._on_stats(event)
        elif isinstance(event, StageFatal):
            self._stage_died(event.stage, f"stage {event.stage!r} failed: {event.message}")

    def _start(self, request: PipelineRequest, sink: Sink) -> None:
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
            self._end(tracked, error=self.dead[dead[0]])
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
        msg.send_to = [
            edge_name(e)
            for e in self.deploy.edges_from(stage)
            if e.transfer != "prompt" and e.dst in tracked.needed
        ]
        tracked.started.add(stage)
        self.stages.send(stage, msg)

    def _on_output(self, event: StageOutput) -> None:
        tracked = self.tracked.get(event.request_id)
        if tracked is None or event.stage not in tracked.results:
            return
        result = tracked.results[event.stage]
        data = None if event.data is None else blob_to_tensor(event.data)
        result.add(event.new_token_ids, event.new_text, data)
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
            self._end(tracked, update=update)  # the final output also brings the last piece
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
                self._end(tracked, error=f"stage {edge.dst!r}: {exc}")
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

    def _on_payload(self, event: PayloadReady) -> None:
        consumer = event.edge.split("->", 1)[1]
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

    def _abort(self, request_id: str) -> None:
        tracked = self.tracked.get(request_id)
        if tracked is not None:
            self._end(tracked, aborted=True)

    def _end(
        self,
        tracked: _Tracked,
        error: str | None = None,
        aborted: bool = False,
        update: OmniRequestOutput | None = None,
    ) -> None:
        request_id = tracked.request.request_id
        if self.tracked.pop(request_id, None) is None:
            return
        if error is not None or aborted:
            for stage in tracked.started:
                if stage not in tracked.done and stage not in self.dead:
                    self.stages.send(stage, AbortRequest(request_id=request_id))
        final = update or OmniRequestOutput(request_id, {})
        final.outputs = _snapshot(tracked, tracked.request.final_stages)
        final.finished, final.error, final.aborted = True, error, aborted
        _emit(tracked.sink, final)

    # -- stats --------------------------------------------------------------------------------------
    def _ask_stats(self, future: Future) -> None:
        if self._stats is not None and time.monotonic() - self._stats[2] < STATS_ROUND_S:
            self._stats[0].append(future)  # a round is in flight: its answer serves both
            return
        live = [n for n in self.clients if n not in self.dead]
        if not live:
            self._stats = None
            future.set_result({})
            return
        self._stats = ([future], {}, time.monotonic())
        for name in live:
            self.stages.send(name, GetStats())

    def _on_stats(self, event: StageStats) -> None:
        if self._stats is None:
            return
        futures, collected, _ = self._stats
        collected[event.stage] = event
        if len(collected) == len([n for n in self.clients if n not in self.dead]):
            self._stats = None
            for future in futures:
                future.set_result(dict(collected))


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
