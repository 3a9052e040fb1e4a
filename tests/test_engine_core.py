"""`EngineCore`'s own bookkeeping, with a recording scheduler and no model: what it forwards
and when it says work is left. Written against mutants `make mutation` found alive."""

from __future__ import annotations

from concurrent.futures import Future

from omnistage.core.engine_core import EngineCore
from omnistage.core.request import RequestStatus


class RecordingScheduler:
    def __init__(self) -> None:
        self.finished: list[tuple[list[str], RequestStatus]] = []
        self.unfinished = False

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
