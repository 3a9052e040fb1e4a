"""Running a stage: in the orchestrator's thread, or in its own (spawned) process.

`make_stage_core` builds the core a stage kind needs. `InProcessStageClient`
steps it in the caller's thread (tests, debugging). `ProcessStageClient`
starts `run_stage` in a new process (`omnistage.child`: our own entry point,
never a re-import of the user's program), which talks to the orchestrator with
msgspec messages over ZMQ: one PULL socket per stage for what it is sent, and
a PUSH to the orchestrator's shared PULL for what it reports. The stage
process exits on `Shutdown`, when the orchestrator's process is gone, or on an
unrecoverable error (after reporting it as `StageFatal`). Its loop, `serve_stage`, is
also what a Ray actor runs (`ray_stage.RayStageClient`, over TCP instead of ipc).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import zmq

from omnistage.child import start_child
from omnistage.pipeline.deploy import DeploySpec, StageSpec
from omnistage.pipeline.faults import install_faults
from omnistage.pipeline.messages import (
    FromStage,
    Shutdown,
    StageFatal,
    StageReady,
    ToStage,
    from_stage_encoder,
    to_stage_decoder,
    to_stage_encoder,
)
from omnistage.pipeline.stage_core import StageCore
from omnistage.pipeline.step_heartbeat import step_heartbeat

logger = logging.getLogger(__name__)
IDLE_POLL_MS = 50
STALLED_POLL_MS = 1


def make_stage_core(spec: StageSpec, deploy: DeploySpec, namespace: str) -> StageCore:
    """The core of `spec`'s kind (with the faults `OMNISTAGE_FAULTS` injects, if set)."""
    core = _new_stage_core(spec, deploy, namespace)
    install_faults(core)
    return core


def _new_stage_core(spec: StageSpec, deploy: DeploySpec, namespace: str) -> StageCore:
    if spec.model is None:
        raise ValueError(
            f"stage {spec.name!r}: no model (give one in the deploy file or Omni(model=...))"
        )
    spec = spec.with_part_directory()
    if spec.kind == "ar":
        from omnistage.pipeline.ar_stage import ARStageCore

        return ARStageCore(spec, deploy, namespace)
    if spec.kind == "generation":
        from omnistage.pipeline.generation_stage import GenerationStageCore

        return GenerationStageCore(spec, deploy, namespace)
    if spec.kind == "diffusion":
        from omnistage.pipeline.diffusion_stage import DiffusionStageCore

        return DiffusionStageCore(spec, deploy, namespace)
    raise ValueError(f"stage {spec.name!r}: kind {spec.kind!r} is not supported")


def ready_message(core: StageCore) -> StageReady:
    model = getattr(core, "model", None)
    return StageReady(
        stage=core.name, pid=os.getpid(), sample_rate=getattr(model, "sample_rate", None)
    )


class StageClient(ABC):
    """The orchestrator's handle on one stage."""

    name: str

    @abstractmethod
    def send(self, msg: ToStage) -> None: ...

    def poll(self) -> list[FromStage]:
        """In-process: handle timeouts and run one step. Process: nothing (see the PULL socket)."""
        return []

    def busy(self) -> bool:
        return False

    def exit_code(self) -> int | None:
        """None while the stage runs; its exit code once its process has ended."""
        return None

    def failure(self) -> str:
        """Why the stage ended (its process's own traceback); "" for in-process stages."""
        return ""

    def request_stop(self) -> None:  # noqa: B027 - optional: only process stages need it
        """Ask the stage to stop without waiting (`close` waits); nothing for in-process."""

    def sockets(self) -> list[zmq.Socket]:
        """Sockets of its own the orchestrator polls (a Ray stage's inbox); see `poll`."""
        return []

    @abstractmethod
    def close(self, timeout: float = 10.0) -> None: ...


class InProcessStageClient(StageClient):
    def __init__(self, spec: StageSpec, deploy: DeploySpec, namespace: str) -> None:
        self.name = spec.name
        self.core = make_stage_core(spec, deploy, namespace)
        self.pending: list[FromStage] = [ready_message(self.core)]

    def send(self, msg: ToStage) -> None:
        self.pending += self.core.handle(msg)

    def poll(self) -> list[FromStage]:
        events, self.pending = self.pending, []
        events += self.core.check_timeouts()
        if self.core.has_work():
            events += self.core.run_step()
        return events

    def busy(self) -> bool:
        return bool(self.pending) or (self.core.has_work() and not self.core.stalled)

    def close(self, timeout: float = 10.0) -> None:
        self.core.shutdown()


class ProcessStageClient(StageClient):
    def __init__(
        self,
        spec: StageSpec,
        deploy: DeploySpec,
        namespace: str,
        context: zmq.Context,
        in_address: str,
        out_address: str,
    ) -> None:
        self.name = spec.name
        self._stop_sent = False
        self.socket = context.socket(zmq.PUSH)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SNDHWM, 0)  # no limit: a send fails only with no peer
        self.socket.bind(in_address)
        try:
            self.process = start_child(
                run_stage,
                spec,
                deploy,
                namespace,
                in_address,
                out_address,
                os.getpid(),
                name=f"omnistage stage {spec.name!r}",
            )
        except BaseException:
            self.socket.close(linger=0)  # else the context can never terminate
            raise

    def send(self, msg: ToStage) -> None:
        """Never waits: with no peer (the process died, its exit not yet reaped; or it has
        not connected yet, which only a stage that is not up can be) the message is
        dropped — a PUSH socket would otherwise wait for a peer forever."""
        if self.process.exitcode is None:
            try:
                self.socket.send(to_stage_encoder.encode(msg), zmq.NOBLOCK, copy=False)
            except zmq.Again:
                logger.warning("stage %s: not connected, %s dropped", self.name, type(msg).__name__)

    def exit_code(self) -> int | None:
        return self.process.exitcode

    @property
    def pid(self) -> int:
        return self.process.pid

    def kill(self) -> None:
        """SIGKILL the stage's process (a hung one: it answers nothing, not even a stop)."""
        self.process.kill()

    def failure(self) -> str:
        """Why the stage's process ended: its own traceback when it left one."""
        return self.process.failure()

    def request_stop(self) -> None:
        if self.process.exitcode is None and not self._stop_sent:
            self._stop_sent = True
            with contextlib.suppress(zmq.ZMQError):
                self.socket.send(to_stage_encoder.encode(Shutdown()), zmq.NOBLOCK)

    def close(self, timeout: float = 10.0) -> None:
        self.request_stop()
        self.process.close(timeout)
        self.socket.close(linger=0)


def run_stage(
    spec: StageSpec,
    deploy: DeploySpec,
    namespace: str,
    in_address: str,
    out_address: str,
    parent_pid: int,
    channel: Connection,
) -> None:
    """Main function of a stage process (run by `omnistage.child`; `channel` stays unused:
    the stage talks over ZMQ, and its exceptions reach the parent through the death note)."""
    logging.basicConfig(level=logging.WARNING)
    context = zmq.Context()
    inbox = context.socket(zmq.PULL)
    inbox.connect(in_address)
    outbox = context.socket(zmq.PUSH)
    outbox.setsockopt(zmq.LINGER, 2000)
    outbox.connect(out_address)
    try:
        serve_stage(spec, deploy, namespace, inbox, outbox, lambda: os.getppid() == parent_pid)
    finally:
        inbox.close(linger=0)
        outbox.close()
        context.term()


def serve_stage(
    spec: StageSpec,
    deploy: DeploySpec,
    namespace: str,
    inbox: zmq.Socket,
    outbox: zmq.Socket,
    keep_going: Callable[[], bool],
) -> None:
    """The stage loop of a stage process or a Ray actor: build the core, report ready, then
    handle what `inbox` brings and step until `Shutdown` or `keep_going()` is false;
    everything it reports goes to `outbox` (also a heartbeat thread's `Busy` while a step
    runs long). An error is reported as `StageFatal`, then raised."""

    sending = threading.Lock()  # the loop and its heartbeat thread share the outbox

    def report(events: list[Any]) -> None:
        if events:
            with sending:
                outbox.send(from_stage_encoder.encode(events), copy=False)

    core = None
    heartbeat = step_heartbeat(spec.name, report, spec.restart.heartbeat_interval_s)
    try:
        core = make_stage_core(spec, deploy, namespace)
        report([ready_message(core)])
        while keep_going():
            ready = inbox.poll(_poll_ms(core))
            with heartbeat.busy():  # a long step says it is busy: it is not hung
                if ready and not _drain(inbox, core, report):
                    return
                events = core.check_timeouts()
                if core.has_work():
                    events += core.run_step()
                report(events)
    except Exception as exc:  # report, then exit: the orchestrator fails our requests
        message = f"{type(exc).__name__}: {exc}"
        report([StageFatal(stage=spec.name, message=message, pid=os.getpid())])
        raise  # a stage process's death note carries the traceback to the parent
    finally:
        heartbeat.close()
        if core is not None:
            core.shutdown()


def _drain(inbox: zmq.Socket, core: StageCore, report: Any) -> bool:
    """Handle every message waiting; False on Shutdown."""
    while True:
        try:
            frame = inbox.recv(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return True
        msg = to_stage_decoder.decode(frame.buffer)
        if isinstance(msg, Shutdown):
            return False
        report(core.handle(msg))


def _poll_ms(core: StageCore) -> int:
    """How long the stage loop waits for messages: not at all while it has work to do."""
    if not core.has_work():
        return IDLE_POLL_MS
    return STALLED_POLL_MS if core.stalled else 0
