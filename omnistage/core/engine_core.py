"""`EngineCore`: the per-stage loop — schedule, execute, update.

`step()` is synchronous: step N+1 is scheduled after step N's tokens are known.
`step_with_batch_queue()` (async scheduling) keeps up to two batches in
flight: it schedules and launches step N+1, then waits for step N and applies
its results. Both produce the same tokens (DESIGN.md invariant 2).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future

from omnistage.core.engine_core_output import EngineCoreOutput
from omnistage.core.executor import Executor
from omnistage.core.request import Request, RequestStatus
from omnistage.core.sched_output import ModelRunnerOutput, SchedulerOutput
from omnistage.core.scheduler import Scheduler

MAX_BATCHES_IN_FLIGHT = 2


class EngineCore:
    def __init__(
        self, scheduler: Scheduler, executor: Executor, async_scheduling: bool = False
    ) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self.async_scheduling = async_scheduling
        self.batch_queue: deque[tuple[SchedulerOutput, Future[ModelRunnerOutput]]] = deque()
        self.step = self.step_with_batch_queue if async_scheduling else self.step_sync
        self.made_progress = False
        """The last step computed something or applied results (False: every request waits,
        e.g. for conditioning rows from another stage; a caller may sleep a little)."""

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def abort_requests(self, request_ids: Iterable[str]) -> None:
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> None:
        self.scheduler.finish_requests(request_ids, status)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or bool(self.batch_queue)

    def step_sync(self) -> list[EngineCoreOutput]:
        """Schedule, run the model, apply the results."""
        self.made_progress = False
        if not self.scheduler.has_unfinished_requests():
            return []
        scheduler_output = self.scheduler.schedule()
        self.made_progress = not scheduler_output.is_empty
        runner_output = self.executor.execute_model(scheduler_output)
        return self.scheduler.update_from_output(scheduler_output, runner_output)

    def step_with_batch_queue(self) -> list[EngineCoreOutput]:
        """Launch step N+1 if there is room, then wait for step N and apply it."""
        self.made_progress = False
        if (
            len(self.batch_queue) < MAX_BATCHES_IN_FLIGHT
            and self.scheduler.has_unfinished_requests()
        ):
            scheduler_output = self.scheduler.schedule()
            if not scheduler_output.is_empty or self._has_news(scheduler_output):
                self.batch_queue.append((scheduler_output, self.executor.submit(scheduler_output)))
                self.made_progress = not scheduler_output.is_empty
                if len(self.batch_queue) < MAX_BATCHES_IN_FLIGHT and not scheduler_output.is_empty:
                    return []  # one batch in flight: go schedule the next one
        if not self.batch_queue:
            return []
        self.made_progress = True
        scheduler_output, future = self.batch_queue.popleft()
        return self.scheduler.update_from_output(scheduler_output, future.result())

    def flush(self) -> None:
        """Wait for every batch in flight and let the runner drop ended requests.

        Called when no request is left, so nothing is held anywhere afterwards.
        """
        while self.batch_queue:
            scheduler_output, future = self.batch_queue.popleft()
            self.scheduler.update_from_output(scheduler_output, future.result())
        if not self.scheduler.has_unfinished_requests():
            scheduler_output = self.scheduler.schedule()
            if self._has_news(scheduler_output):
                self.executor.execute_model(scheduler_output)

    @staticmethod
    def _has_news(scheduler_output: SchedulerOutput) -> bool:
        """Ended or preempted requests the runner must hear of even in an empty step."""
        return bool(scheduler_output.finished_req_ids or scheduler_output.preempted_req_ids)

    def shutdown(self) -> None:
        self.batch_queue.clear()
        self.executor.shutdown()
