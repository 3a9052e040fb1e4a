"""`ProcessExecutor`: the model runner in a worker process (async scheduling's default).

A worker thread cannot overlap Python work with Python work (the GIL), so with
async scheduling the runner runs in a spawned process: the engine core
schedules step N+1 and processes step N's outputs while the worker executes.
Messages are msgspec structs over a pipe, in order: the worker handles one
request at a time, so replies come back in the order requests were sent.

The worker builds the runner side itself (model, KV cache tensors) and
replies `Ready` with the number of KV blocks; any exception in the worker
comes back as `Failed` with its traceback and is raised in the engine.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import traceback
from collections import deque
from multiprocessing.connection import Connection
from typing import Any

import msgspec

from omnistage.config import EngineConfig
from omnistage.core.sched_output import ModelRunnerOutput, SchedulerOutput


class Step(msgspec.Struct, tag=True):
    scheduler_output: SchedulerOutput


class StatsQuery(msgspec.Struct, tag=True):
    pass


class Shutdown(msgspec.Struct, tag=True):
    pass


class Ready(msgspec.Struct, tag=True):
    num_kv_blocks: int


class StepDone(msgspec.Struct, tag=True):
    runner_output: ModelRunnerOutput


class Stats(msgspec.Struct, tag=True):
    values: dict[str, int]


class Failed(msgspec.Struct, tag=True):
    error: str


_ENCODER = msgspec.msgpack.Encoder()
_TO_WORKER = msgspec.msgpack.Decoder(Step | StatsQuery | Shutdown)
_FROM_WORKER = msgspec.msgpack.Decoder(Ready | StepDone | Stats | Failed)


class RunnerFailed(RuntimeError):
    """The worker process failed; the message carries its traceback."""


def _worker_main(config: EngineConfig, files: Any, hf_config: Any, conn: Connection) -> None:
    try:
        from omnistage.engine.builder import build_runner

        runner = build_runner(config, files, hf_config)
        conn.send_bytes(_ENCODER.encode(Ready(num_kv_blocks=runner.num_kv_blocks)))
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


class ProcessExecutor:
    def __init__(self, config: EngineConfig, files: Any, hf_config: Any) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_worker_main,
            args=(config, files, hf_config, child),
            name="omnistage-runner",
            daemon=True,
        )
        self._proc.start()
        child.close()
        self._pending: deque[_PendingStep] = deque()
        ready = self._recv()
        if isinstance(ready, Failed):
            self._proc.join(timeout=10)
            raise _as_user_error(ready.error)
        self.num_kv_blocks = ready.num_kv_blocks

    def submit(self, scheduler_output: SchedulerOutput) -> _PendingStep:
        self._conn.send_bytes(_ENCODER.encode(Step(scheduler_output=scheduler_output)))
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
        except (EOFError, ConnectionError) as exc:
            raise RunnerFailed(
                f"model runner worker died (exit code {self._proc.exitcode})"
            ) from exc

    def shutdown(self) -> None:
        if self._proc.is_alive():
            with contextlib.suppress(BrokenPipeError, OSError):
                self._conn.send_bytes(_ENCODER.encode(Shutdown()))
            self._proc.join(timeout=10)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join()
        self._conn.close()

    def __del__(self) -> None:
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.is_alive():
            proc.kill()


def _as_user_error(worker_traceback: str) -> Exception:
    """A ValueError raised while building the runner is the user's (bad model, bad size)."""
    last = worker_traceback.strip().splitlines()[-1]
    if last.startswith("ValueError: "):
        return ValueError(last.removeprefix("ValueError: "))
    return RunnerFailed(f"model runner worker failed to start:\n{worker_traceback}")
