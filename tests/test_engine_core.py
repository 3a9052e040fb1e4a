"""`EngineCore`'s own bookkeeping, with a recording scheduler and no model: what it forwards
and when it says work is left. Written against mutants `make mutation` found alive."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

from omnistage.core.engine_core import EngineCore
from omnistage.core.request import RequestStatus
from omnistage.core.step_isolation import StepIsolation


class Scheduled:
    def __init__(self, is_empty: bool) -> None:
        self.is_empty = is_empty
        self.finished_req_ids: set[str] = set()
        self.preempted_req_ids: set[str] = set()


class RecordingScheduler:
    def __init__(self) -> None:
        self.finished: list[tuple[list[str], RequestStatus]] = []
        self.unfinished = False
        self.next_empty = False
        self.updates = 0
        self.applied: list[tuple[object, object]] = []
        self.schedules = 0
        self.next_finished: set[str] = set()
        self.isolation = StepIsolation()

    def schedule(self) -> Scheduled:
        self.schedules += 1
        scheduled = Scheduled(self.next_empty)
        scheduled.finished_req_ids = set(self.next_finished)
        return scheduled

    def update_from_output(self, scheduled, runner_output) -> list:
        self.updates += 1
        self.applied.append((scheduled, runner_output))
        return []

    def finish_requests(self, request_ids, status) -> None:
        self.finished.append((list(request_ids), status))

    def has_unfinished_requests(self) -> bool:
        return self.unfinished


def test_finish_and_abort_reach_the_scheduler_with_their_status():
    scheduler = RecordingScheduler()
    core = EngineCore(scheduler, executor=None)  # type: ignore[arg-type]
    core.finish_requests(["a"], RequestStatus.FINISHED_STOPPED)
    core.abort_requests(["b", "c"])
    assert scheduler.finished == [
        (["a"], RequestStatus.FINISHED_STOPPED),
        (["b", "c"], RequestStatus.FINISHED_ABORTED),
    ]


def test_a_batch_in_flight_is_unfinished_work_even_when_the_scheduler_is_empty():
    scheduler = RecordingScheduler()
    core = EngineCore(scheduler, executor=None, async_scheduling=True)  # type: ignore[arg-type]
    assert not core.has_unfinished_requests()
    core.batch_queue.append((None, Future()))  # type: ignore[arg-type]
    assert core.has_unfinished_requests()
    core.batch_queue.clear()
    scheduler.unfinished = True
    assert core.has_unfinished_requests()


def test_a_sync_step_says_whether_it_computed_anything():
    scheduler = RecordingScheduler()
    executor = SimpleNamespace(execute_model=lambda scheduled: "runner output")
    core = EngineCore(scheduler, executor)  # type: ignore[arg-type]
    assert core.step == core.step_sync
    core.made_progress = True
    assert core.step() == [] and core.made_progress is False  # nothing to do: not run
    assert scheduler.updates == 0
    scheduler.unfinished = True
    core.step()
    assert core.made_progress is True and scheduler.updates == 1
    scheduler.next_empty = True  # every request waits (e.g. for another stage's rows)
    core.step()
    assert core.made_progress is False and scheduler.updates == 2


def test_an_async_step_keeps_one_batch_ahead_and_says_whether_it_computed_anything():
    scheduler = RecordingScheduler()

    def submit(scheduled):
        future: Future = Future()
        future.set_result("runner output")
        return future

    core = EngineCore(scheduler, SimpleNamespace(submit=submit), async_scheduling=True)  # type: ignore[arg-type]
    assert core.step == core.step_with_batch_queue
    core.made_progress = True
    assert core.step() == [] and core.made_progress is False  # idle: nothing scheduled
    assert scheduler.schedules == 0
    scheduler.unfinished = True
    core.step()  # launches step 1 and returns at once
    assert (scheduler.schedules, scheduler.updates, len(core.batch_queue)) == (1, 0, 1)
    assert core.made_progress is True
    core.made_progress = False
    core.step()  # launches step 2, then applies step 1
    assert (scheduler.schedules, scheduler.updates, len(core.batch_queue)) == (2, 1, 1)
    assert core.made_progress is True


def test_flush_applies_the_batches_in_flight_and_tells_the_runner_what_ended():
    """With no request left: every batch in flight is applied (one whose runner failed is
    dropped: nobody is left to tell), then one empty step carries the ended requests to the
    runner, which drops them; with requests left, flush schedules nothing."""
    scheduler, sent = RecordingScheduler(), []
    core = EngineCore(scheduler, SimpleNamespace(execute_model=sent.append), async_scheduling=True)  # type: ignore[arg-type]
    assert core.made_progress is False  # nothing computed yet
    done, failed = Future(), Future()
    done.set_result("runner output")
    failed.set_exception(RuntimeError("the runner died"))
    core.batch_queue.extend([("step 1", done), ("step 2", failed)])  # type: ignore[list-item]
    scheduler.next_finished = {"a"}
    core.flush()
    assert scheduler.applied == [("step 1", "runner output")] and not core.batch_queue
    assert [s.finished_req_ids for s in sent] == [{"a"}]
    scheduler.unfinished = True
    core.flush()
    assert len(sent) == 1 and scheduler.schedules == 1
