"""`ProcessExecutor`: the model runner in a worker process (async scheduling's default).

A worker thread cannot overlap Python work with Python work (the GIL), so with
async scheduling the runner runs in a worker process (`python -m
omnistage.child`, see `omnistage.child`: never a re-import of the user's
program): the engine core schedules step N+1 and processes step N's outputs
while the worker executes. Messages are msgspec structs over the child's
channel, in order: the worker handles one request at a time, so replies come
back in the order requests were sent.

The worker builds the runner side itself (model, KV cache tensors) and
replies `Ready` with the number of KV blocks; any exception in the worker
comes back as `Failed` with its traceback and is raised in the engine. A
worker that dies without a word (killed, crashed) is reported with what it
left in its death note (`ChildProcess.failure`).

The worker is started by `start()` and waited for by `wait_ready()`, so a
frontend can start it first and set itself up (tokenizer, detokenizer) while
the worker imports torch and loads the model.
"""

from __future__ import annotations

import contextlib
import traceback
from collections import deque
from multiprocessing.connection import Connection
from typing import Any

import msgspec

from omnistage.child import ChildError, ChildProcess, resolve_function
from omnistage.core.executor import Executor, Runner, RunnerGone
from omnistage.core.sched_output import ModelRunnerOutput, SchedulerOutput
from omnistage.core.worker_process import start_runner_worker


class Step(msgspec.Struct, tag=True):
    scheduler_output: SchedulerOutput


class StatsQuery(msgspec.Struct, tag=True):
    pass


class Shutdown(msgspec.Struct, tag=True):
    pass


class Ready(msgspec.Struct, tag=True):
    num_kv_blocks: int
    startup_phases: dict[str, float] = {}


class StepDone(msgspec.Struct, tag=True):
    runner_output: ModelRunnerOutput


class Stats(msgspec.Struct, tag=True):
    values: dict[str, int]


class Failed(msgspec.Struct, tag=True):
    error: str


_ENCODER = msgspec.msgpack.Encoder()
_TO_WORKER = msgspec.msgpack.Decoder(Step | StatsQuery | Shutdown)
_FROM_WORKER = msgspec.msgpack.Decoder(Ready | StepDone | Stats | Failed)


class RunnerFailed(ChildError):
    """The worker process failed; the message carries its traceback."""


class RunnerDied(RunnerFailed, RunnerGone):
    """The worker process is gone (killed, crashed), with what it left in its death note."""


def worker_main(factory: str, args: tuple, conn: Connection) -> None:
    """The worker process's main function (run by `omnistage.child`): `factory` is the
    "module:function" name of what builds the runner from `args`."""
    try:
        runner: Runner = resolve_function(factory)(*args)
        phases = getattr(runner, "startup_phases", {})
        conn.send_bytes(
            _ENCODER.encode(Ready(num_kv_blocks=runner.num_kv_blocks, startup_phases=phases))
        )
    except BaseException:  # noqa: BLE001 - reported to the engine, which raises it
        conn.send_bytes(_ENCODER.encode(Failed(error=traceback.format_exc())))
        return
    while True:
        try:
            message = _TO_WORKER.decode(conn.recv_bytes())
        except EOFError:
            return
        if isinstance(message, Shutdown):
            return
        try:
            if isinstance(message, Step):
                reply: Any = StepDone(runner_output=runner.execute_model(message.scheduler_output))
            else:
                reply = Stats(values=runner.stats())
        except BaseException:  # noqa: BLE001
            reply = Failed(error=traceback.format_exc())
        conn.send_bytes(_ENCODER.encode(reply))


class _PendingStep:
    """Future-like handle of a step sent to the worker; `result()` waits in send order."""

    def __init__(self, executor: ProcessExecutor) -> None:
        self._executor = executor
        self._done = False
        self._value: ModelRunnerOutput | None = None
        self._error: str | None = None

    def result(self) -> ModelRunnerOutput:
        while not self._done:
            self._executor._receive_one()
        if self._error is not None:
            raise RunnerFailed(f"model runner worker failed:\n{self._error}")
        assert self._value is not None  # internal: a done step has a value or an error
        return self._value


class ProcessExecutor(Executor):
    """The runner in a worker process: `factory(*args)` builds it there.

    The constructor returns once the worker is started; `wait_ready()` blocks until
    the runner is built (the caller sets itself up meanwhile)."""

    def __init__(self, factory: str, *args: Any, child: ChildProcess | None = None) -> None:
        """Start a worker whose runner `factory(*args)` builds ("module:function", see
        `worker_process`), or adopt `child`, a worker already started that way."""
        self._child = child if child is not None else start_runner_worker(factory, *args)
        self._pending: deque[_PendingStep] = deque()
        self.num_kv_blocks = -1
        self.startup_phases: dict[str, float] = {}

    def wait_ready(self) -> None:
        """Block until the worker has built the runner; raise its error if it could not."""
        ready = self._recv()
        if isinstance(ready, Failed):
            self._child.close(timeout=10)
            raise _as_user_error(ready.error)
        self.num_kv_blocks = ready.num_kv_blocks
        self.startup_phases = ready.startup_phases

    @property
    def _conn(self) -> Connection:
        return self._child.channel

    def submit(self, scheduler_output: SchedulerOutput) -> _PendingStep:
        message = _ENCODER.encode(Step(scheduler_output=scheduler_output))
        try:
            self._conn.send_bytes(message)
        except OSError:
            raise RunnerDied(f"model runner worker died: {self._child.failure()}") from None
        pending = _PendingStep(self)
        self._pending.append(pending)
        return pending

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.submit(scheduler_output).result()

    def runner_stats(self) -> dict[str, int]:
        while self._pending:
            self._receive_one()
        self._conn.send_bytes(_ENCODER.encode(StatsQuery()))
        reply = self._recv()
        if isinstance(reply, Failed):
            raise RunnerFailed(reply.error)
        return reply.values

    def _receive_one(self) -> None:
        reply = self._recv()
        pending = self._pending.popleft()
        if isinstance(reply, StepDone):
            pending._value = reply.runner_output
        else:
            pending._error = (
                reply.error if isinstance(reply, Failed) else f"unexpected reply {reply!r}"
            )
        pending._done = True

    def _recv(self) -> Any:
        try:
            return _FROM_WORKER.decode(self._conn.recv_bytes())
        except (EOFError, ConnectionError, OSError):
            raise RunnerDied(f"model runner worker died: {self._child.failure()}") from None

    def shutdown(self) -> None:
        if self._child.is_alive():
            with contextlib.suppress(BrokenPipeError, OSError):
                self._conn.send_bytes(_ENCODER.encode(Shutdown()))
        self._child.close(timeout=10)

    @property
    def child(self) -> ChildProcess:
        return self._child


def _as_user_error(worker_traceback: str) -> Exception:
    """A ValueError raised while building the runner is the user's (bad model, bad size):
    it stays a ValueError, with the worker's traceback as its cause."""
    failure = RunnerFailed(f"model runner worker failed to start:\n{worker_traceback}")
    last = worker_traceback.strip().splitlines()[-1]
    if last.startswith("ValueError: "):
        error = ValueError(last.removeprefix("ValueError: "))
        error.__cause__ = failure
        return error
    return failure
