"""The consumer's `InputCoordinator` at its edges: deadlines reached exactly, the next
deadline to sleep until. Written against mutants `make mutation` found alive."""

from __future__ import annotations

from omnistage.pipeline.coordinator import InputCoordinator


def coordinator_at(now: list[float]) -> InputCoordinator:
    return InputCoordinator(timeout_s=2.0, clock=lambda: now[0])


def test_a_wait_expires_at_its_deadline_not_after_it():
    now = [10.0]
    coordinator = coordinator_at(now)
    coordinator.park("r1", "submit", ["b->c", "a->c"])
    now[0] = 11.999
    assert coordinator.expired() == []
    now[0] = 12.0
    assert coordinator.expired() == [("r1", "a->c")]  # the first edge it still waits on
    assert not coordinator.is_waiting("r1") and coordinator.num_entries == 0


def test_the_next_deadline_is_the_earliest_and_none_without_waits():
    now = [0.0]
    coordinator = coordinator_at(now)
    assert coordinator.next_deadline() is None
    coordinator.park("r1", "submit", ["a->b"])
    now[0] = 1.5
    coordinator.park("r2", "submit", ["a->b"])
    assert coordinator.next_deadline() == 2.0
    coordinator.arrived("r1", "a->b", "chunk", last=False)  # restarts r1's wait
    assert coordinator.next_deadline() == 3.5
    assert coordinator.arrived("nobody", "a->b", "chunk", last=True) is None
