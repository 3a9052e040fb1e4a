"""`Orchestrator`: the thread that runs a pipeline's requests against its stages.

It runs in a thread of the frontend process and owns the stages (`StageSet`):
frontend calls (submit, abort, stats) become commands the thread runs between
polls (an inproc socket wakes it), and every event a stage reports goes to the
`RequestRouter`, which decides where each request goes next and when it ends
(see `routing.py`), or to the stats round in flight. The `StageSupervisor`
watches the stage processes: one that dies or hangs fails the requests that need
it (503s naming it) and is restarted with backoff; `health()` says which stages
are up. An orchestrator that fails fails every request.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import zmq

from omnistage.pipeline.deploy import DeploySpec
from omnistage.pipeline.messages import (
    FromStage,
    GetStats,
    PayloadReady,
    RequestFailed,
    StageOutput,
    StageReady,
    StageStats,
)
from omnistage.pipeline.outputs import OmniRequestOutput
from omnistage.pipeline.routing import PipelineRequest, RequestRouter, Sink
from omnistage.pipeline.stage_process import StageClient
from omnistage.pipeline.stage_set import StageSet
from omnistage.pipeline.stage_supervisor import StageHealth, StageSupervisor

__all__ = ["Orchestrator", "PipelineRequest", "Sink", "StageHealth"]

logger = logging.getLogger(__name__)
IDLE_POLL_MS = 100
"""Longest sleep of an idle loop: stage deaths are noticed within this."""
STATS_ROUND_S = 5.0
"""A stats round unanswered this long (a stage died meanwhile) is asked again."""


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
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._stats: tuple[list[Future], dict[str, StageStats], float, set[str]] | None = None
        """The stats round in flight: its waiters, the replies so far, when it began, and
        the stages asked."""
        self._stopping = False
        self._ended: str | None = None
        """Why the loop ended (shut down, or failed): commands from then on fail at once."""
        try:
            self.stages = StageSet(deploy, namespace, self.context, in_process, startup_timeout_s)
        except BaseException:
            self.context.term()
            raise
        self.sample_rates = self.stages.sample_rates
        self.router = RequestRouter(deploy, self.stages)
        self.supervisor = StageSupervisor(
            deploy, self.stages, self._stage_down, self.router.stage_up, startup_timeout_s
        )
        # Commands wake the loop through an inproc socket, so it can sleep in one poll.
        self._wake_in = self.context.socket(zmq.PULL)
        self._wake_in.bind(f"inproc://wake-{id(self)}")
        self._wake_out = self.context.socket(zmq.PUSH)
        self._wake_out.connect(f"inproc://wake-{id(self)}")
        self._wake_lock = threading.Lock()
        self._poller = zmq.Poller()
        for socket in self.stages.sockets():  # the shared inbox, and each Ray replica's
            self._poller.register(socket, zmq.POLLIN)
        self._poller.register(self._wake_in, zmq.POLLIN)
        self._thread = threading.Thread(
            target=self._run, name="omnistage-orchestrator", daemon=True
        )
        self._thread.start()

    @property
    def clients(self) -> dict[str, StageClient]:
        return self.stages.clients

    @property
    def dead(self) -> dict[str, str]:
        """Stages that are not up (restarting or down), with the reason their requests
        fail with."""
        return self.router.dead

    def health(self) -> dict[str, StageHealth]:
        """Each stage's state (up, restarting, down), restarts and last failure; any
        thread may ask."""
        return self.supervisor.health

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
                if self._ended is None:
                    self.router.start(request, sink)
                else:  # the loop ended after this was queued: nothing will run it
                    sink(OmniRequestOutput(request.request_id, {}, True, self._ended))

        self._command(start)

    def abort(self, request_id: str) -> None:
        self._command(lambda: self.router.abort(request_id))

    def _command(self, command: Callable[[], None]) -> None:
        with self._wake_lock:
            if self._ended is None:
                self._commands.put(command)
                if not self._stopping:
                    self._wake_out.send(b"", zmq.NOBLOCK)
                return
        command()  # the loop has ended: the command fails at once (see `_end`)

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
        return len(self.router.tracked)

    def shutdown(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        self._thread.join(30)
        self.router.fail_all("the pipeline was shut down")
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
            self._end(f"orchestrator failed: {exc}")
            return
        self._end("the pipeline was shut down")

    def _end(self, reason: str) -> None:
        """The loop is over: fail every request in flight, and every command queued (a
        request submitted meanwhile included) or still to come, with `reason`."""
        with self._wake_lock:
            self._ended = reason
        self.router.fail_all(reason)
        while True:
            try:
                self._commands.get_nowait()()
            except queue.Empty:
                return

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
        self.supervisor.check()

    def _stage_down(self, name: str, reason: str) -> None:
        self.router.stage_down(name, reason)
        self._finish_stats_round()  # the stage will not answer the round in flight

    def _route(self, event: FromStage) -> None:
        self.supervisor.heard(event)
        if isinstance(event, StageOutput):
            self.router.on_output(event)
        elif isinstance(event, PayloadReady):
            self.router.on_payload(event)
        elif isinstance(event, RequestFailed):
            self.router.on_failed(event)
        elif isinstance(event, StageStats):
            self._on_stats(event)
        elif isinstance(event, StageReady):
            self.sample_rates[self.stages.stage_of(event.stage)] = event.sample_rate

    # -- stats --------------------------------------------------------------------------------------
    def _ask_stats(self, future: Future) -> None:
        if self._ended is not None:
            future.set_result({})
            return
        if self._stats is not None and time.monotonic() - self._stats[2] < STATS_ROUND_S:
            self._stats[0].append(future)  # a round is in flight: its answer serves both
            return
        live = {n for n in self.clients if self.supervisor.is_up(n)}
        self._stats = ([future], {}, time.monotonic(), live)
        for name in live:
            self.stages.send(name, GetStats())
        self._finish_stats_round()

    def _on_stats(self, event: StageStats) -> None:
        if self._stats is not None:
            self._stats[1][event.stage] = event
            self._finish_stats_round()

    def _finish_stats_round(self) -> None:
        """Answer the round's waiters once every stage asked that is still up replied."""
        if self._stats is None:
            return
        futures, collected, _, asked = self._stats
        if all(n in collected or not self.supervisor.is_up(n) for n in asked):
            self._stats = None
            for future in futures:
                future.set_result(dict(collected))
