"""`EngineCore`: the per-stage loop — schedule, execute, update.

`step()` is synchronous: step N+1 is scheduled after step N's tokens are known.
`step_with_batch_queue()` (async scheduling) keeps up to two batches in
flight: it schedules and launches step N+1, then waits for step N and applies
its results. Both produce the same tokens (DESIGN.md invariant 2).

A step whose model call raises is contained (`_contain`): the batches in flight after it
are dropped, everything running is preempted, and the step's requests either take the
blame (it ran one: `StepFailed`) or run alone one by one to find it (`step_isolation`).
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future

from omnistage.core.engine_core_output import EngineCoreOutput
from omnistage.core.executor import Executor, RunnerGone
from omnistage.core.request import Request, RequestStatus
from omnistage.core.sched_output import ModelRunnerOutput, SchedulerOutput
from omnistage.core.scheduler import Scheduler
from omnistage.core.step_isolation import StepFailed

logger = logging.getLogger(__name__)

MAX_BATCHES_IN_FLIGHT = 2


class EngineCore:
    def __init__(
        self, scheduler: Scheduler, executor: Executor, async_scheduling: bool = False
    ) -> None:
        self.scheduler = scheduler
        self.executor = executor
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
        try:
            runner_output = self.executor.execute_model(scheduler_output)
        except Exception as exc:
            return self._contain(scheduler_output, exc)
        return self._apply(scheduler_output, runner_output)

    def step_with_batch_queue(self) -> list[EngineCoreOutput]:
        """Launch step N+1 if there is room, then wait for step N and apply it."""
        self.made_progress = False
        # On entry at most one batch is in flight (every call that fills the queue to
        # MAX_BATCHES_IN_FLIGHT applies one before it returns): there is room for one more.
        if self.scheduler.has_unfinished_requests():
            scheduler_output = self.scheduler.schedule()
            if not scheduler_output.is_empty or self._has_news(scheduler_output):
                try:
                    future = self.executor.submit(scheduler_output)
                except Exception as exc:  # e.g. the batch could not be sent to the worker
                    return self._contain(scheduler_output, exc)
                self.batch_queue.append((scheduler_output, future))
                self.made_progress = not scheduler_output.is_empty
                if len(self.batch_queue) < MAX_BATCHES_IN_FLIGHT and not scheduler_output.is_empty:
                    return []  # one batch in flight: go schedule the next one
        if not self.batch_queue:
            return []
        self.made_progress = True
        scheduler_output, future = self.batch_queue.popleft()
        try:
            runner_output = future.result()
        except Exception as exc:
            return self._contain(scheduler_output, exc)
        return self._apply(scheduler_output, runner_output)

    def _apply(
        self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> list[EngineCoreOutput]:
        outputs = self.scheduler.update_from_output(scheduler_output, runner_output)
        self.scheduler.isolation.cleared(outputs)
        return outputs

    def _contain(self, failed: SchedulerOutput, exc: Exception) -> list[EngineCoreOutput]:
        """A step's model call raised: drop the batches launched after it (they read its
        tokens), preempt everything running, forget the prefix cache, and find whom to
        blame. A step of one request blames it (`StepFailed`); of several, each runs alone
        next (no outputs now). A runner that is gone is not contained: it raises on."""
        if isinstance(exc, RunnerGone):
            raise exc
        for _, future in self.batch_queue:
            with contextlib.suppress(Exception):
                future.result()
        self.batch_queue.clear()
        self.scheduler.preempt_running()
        # Blocks enter the prefix cache when allocated, before their step runs: the failed
        # steps' may hold garbage. Nothing is held now, so the whole cache can go.
        if not self.scheduler.kv.reset_prefix_cache():
            raise RuntimeError("KV blocks still held after preempting every request") from exc
        self.scheduler.isolation.num_failed_steps += 1
        ran = [r for r in failed.num_scheduled_tokens if r in self.scheduler.requests]
        if len(ran) > 1:
            logger.warning("a step of %d requests failed (%s); each runs alone", len(ran), exc)
            self.scheduler.isolation.suspect(ran)
            return []
        logger.error("a step failed on request(s) %s", ran, exc_info=exc)
        raise StepFailed(ran, exc) from exc

    def flush(self) -> None:
        """Wait for every batch in flight and let the runner drop ended requests.

        Called when no request is left, so nothing is held anywhere afterwards.
        """
        while self.batch_queue:
            scheduler_output, future = self.batch_queue.popleft()
            with contextlib.suppress(Exception):  # every request has ended: nobody to tell
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
