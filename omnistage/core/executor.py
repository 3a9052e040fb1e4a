"""Executors: where the model runner runs relative to the engine core.

`Executor` is what the engine core drives, whatever the place: `execute_model`
(sync scheduling), `submit` and the handle's `result()` (async scheduling: up to
two steps in flight, results in submission order), `runner_stats`, `shutdown`.
`InlineExecutor` runs the runner in the caller's thread (sync scheduling).
`ThreadExecutor` runs it on one worker thread and returns futures (async
scheduling): the engine core schedules step N+1 while step N executes. One
worker keeps steps in order, so the runner sees step N's sampled tokens before
it starts N+1. torch and the C kernels release the GIL while they compute.
`ProcessExecutor` (`process_executor.py`) runs it in a worker process (async
scheduling's default).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from omnistage.core.sched_output import ModelRunnerOutput, SchedulerOutput


class RunnerGone(RuntimeError):
    """The runner is gone (its worker process killed or crashed): no step can run any
    more. The engine core never contains this one (`EngineCore._contain`)."""


class Runner(Protocol):
    num_kv_blocks: int

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput: ...

    def stats(self) -> dict[str, int]: ...


class StepHandle(Protocol):
    """A submitted step: `result()` waits for its output (or raises the runner's error)."""

    def result(self) -> ModelRunnerOutput: ...


class Executor(ABC):
    """Where the model runner runs; the engine core drives every executor the same way."""

    num_kv_blocks: int
    """The KV cache blocks the runner allocated (the scheduler's pool)."""
    startup_phases: dict[str, float]
    """How long each part of building the runner took (seconds)."""

    @abstractmethod
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step and wait for its output."""

    @abstractmethod
    def submit(self, scheduler_output: SchedulerOutput) -> StepHandle:
        """Start one step; its output comes from the handle, in submission order."""

    @abstractmethod
    def runner_stats(self) -> dict[str, int]:
        """What the runner holds (batch rows, known requests): zero when idle."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the runner's thread or process."""


class InlineExecutor(Executor):
    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.num_kv_blocks: int = runner.num_kv_blocks
        self.startup_phases: dict[str, float] = getattr(runner, "startup_phases", {})

    def runner_stats(self) -> dict[str, int]:
        return self.runner.stats()

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.runner.execute_model(scheduler_output)

    def submit(self, scheduler_output: SchedulerOutput) -> Future[ModelRunnerOutput]:
        future: Future[ModelRunnerOutput] = Future()
        try:
            future.set_result(self.runner.execute_model(scheduler_output))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
            future.set_exception(exc)
        return future

    def shutdown(self) -> None:
        """Nothing runs but the caller's thread."""


class ThreadExecutor(InlineExecutor):
    def __init__(self, runner: Runner) -> None:
        super().__init__(runner)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="omnistage-runner")

    def submit(self, scheduler_output: SchedulerOutput) -> Future[ModelRunnerOutput]:
        return self._pool.submit(self.runner.execute_model, scheduler_output)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)
