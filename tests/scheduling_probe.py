"""`SchedulingProbe`: watch one engine core schedule, so tests can tell sync from async.

A test that only read `config.async_scheduling` or the scheduler's class would pass
even if the step loop ignored them. The probe observes what the modes do differently:

- at each `schedule()`, how many non-empty batches were handed to the executor whose
  results are not applied yet (async: one, the step it overlaps; sync: none) and how
  many tokens the scheduler then counts as placeholders (tokens in flight; sync: none);
- at each `update_from_output`, how many scheduled requests had already ended when
  their results arrived (a step scheduled ahead of a stop, whose results must be
  dropped; sync: none).

It wraps the instance's methods (never the classes) and unwraps them on exit.
"""

from __future__ import annotations

from typing import Any

from omnistage.core.engine_core import EngineCore
from omnistage.core.sched_output import ModelRunnerOutput, SchedulerOutput


class SchedulingProbe:
    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.in_flight_at_schedule: list[int] = []
        """Per `schedule()` call: batches handed to the executor, results not applied yet."""
        self.placeholders_at_schedule: list[int] = []
        """Per `schedule()` call: placeholder tokens the scheduler counts once it scheduled,
        all requests (the step's own tokens, and the overlapped step's)."""
        self.results_for_ended_requests = 0
        """Scheduled requests that had ended before their step's results arrived."""
        self._pending: set[int] = set()

    @property
    def most_in_flight(self) -> int:
        return max(self.in_flight_at_schedule, default=0)

    @property
    def most_placeholders(self) -> int:
        return max(self.placeholders_at_schedule, default=0)

    def __enter__(self) -> SchedulingProbe:
        scheduler, executor = self.core.scheduler, self.core.executor
        schedule, update = scheduler.schedule, scheduler.update_from_output
        execute, submit = executor.execute_model, executor.submit

        def probed_schedule() -> SchedulerOutput:
            self.in_flight_at_schedule.append(len(self._pending))
            scheduler_output = schedule()
            placeholders = sum(r.num_output_placeholders for r in scheduler.requests.values())
            self.placeholders_at_schedule.append(placeholders)
            return scheduler_output

        def handed(scheduler_output: SchedulerOutput) -> None:
            if scheduler_output.num_scheduled_tokens:  # objects alive while pending: ids unique
                self._pending.add(id(scheduler_output))

        def probed_execute(scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
            handed(scheduler_output)
            return execute(scheduler_output)

        def probed_submit(scheduler_output: SchedulerOutput) -> Any:
            handed(scheduler_output)
            return submit(scheduler_output)

        def probed_update(scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput):
            self._pending.discard(id(scheduler_output))
            ended = [
                r for r in scheduler_output.num_scheduled_tokens if r not in scheduler.requests
            ]
            self.results_for_ended_requests += len(ended)
            return update(scheduler_output, runner_output)

        scheduler.schedule = probed_schedule
        scheduler.update_from_output = probed_update
        executor.execute_model = probed_execute
        executor.submit = probed_submit
        return self

    def __exit__(self, *exc: object) -> None:
        for obj, name in (
            (self.core.scheduler, "schedule"),
            (self.core.scheduler, "update_from_output"),
            (self.core.executor, "execute_model"),
            (self.core.executor, "submit"),
        ):
            vars(obj).pop(name, None)
