"""Executors: where the model runner runs relative to the engine core.

`InlineExecutor` runs it in the caller's thread (sync scheduling). The async
scheduler (next issue) adds an executor that runs it on a worker thread and
returns futures; the engine core talks to both through `execute_model`.
"""

from __future__ import annotations

from typing import Protocol

from omnistage.core.sched_output import ModelRunnerOutput, SchedulerOutput


class Runner(Protocol):
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput: ...


class InlineExecutor:
    def __init__(self, runner: Runner) -> None:
        self.runner = runner

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.runner.execute_model(scheduler_output)

    def shutdown(self) -> None:
        pass
