"""`EngineCore`: the per-stage loop — schedule, execute, update."""

from __future__ import annotations

from collections.abc import Iterable

from omnistage.core.engine_core_output import EngineCoreOutput
from omnistage.core.executor import InlineExecutor
from omnistage.core.request import Request, RequestStatus
from omnistage.core.scheduler import Scheduler


class EngineCore:
    def __init__(self, scheduler: Scheduler, executor: InlineExecutor) -> None:
        self.scheduler = scheduler
        self.executor = executor

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def abort_requests(self, request_ids: Iterable[str]) -> None:
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> None:
        self.scheduler.finish_requests(request_ids, status)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> list[EngineCoreOutput]:
        """One synchronous step: schedule, run the model, apply the results."""
        if not self.scheduler.has_unfinished_requests():
            return []
        scheduler_output = self.scheduler.schedule()
        runner_output = self.executor.execute_model(scheduler_output)
        return self.scheduler.update_from_output(scheduler_output, runner_output)

    def shutdown(self) -> None:
        self.executor.shutdown()
