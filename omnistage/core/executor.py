"""Executors: where the model runner runs relative to the engine core.

`InlineExecutor` runs it in the caller's thread (sync scheduling).
`ThreadExecutor` runs it on one worker thread and returns futures (async
scheduling): the engine core schedules step N+1 while step N executes. One
worker keeps steps in order, so the runner sees step N's sampled tokens before
it starts N+1. torch and the C kernels release the GIL while they compute.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from omnistage.core.sched_output import ModelRunnerOutput, SchedulerOutput


class Runner(Protocol):
    num_kv_blocks: int

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput: ...

    def stats(self) -> dict[str, int]: ...


class InlineExecutor:
    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.num_kv_blocks: int = runner.num_kv_blocks
        self.startup_phases: dict[str, float] = getattr(runner, "startup_phases", {})

    def runner_stats(self) -> dict[str, int]:
        """What the runner holds (batch rows, known requests): zero when idle."""
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
        pass


class ThreadExecutor(InlineExecutor):
    def __init__(self, runner: Runner) -> None:
        super().__init__(runner)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="omnistage-runner")

    def submit(self, scheduler_output: SchedulerOutput) -> Future[ModelRunnerOutput]:
        return self._pool.submit(self.runner.execute_model, scheduler_output)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)
