"""A stage's heartbeat thread says `Busy` while the stage loop is busy, with the time since
the loop became busy, and says nothing while the loop waits for messages or once closed."""

from __future__ import annotations

import threading
import time

from omnistage.pipeline.messages import Busy
from omnistage.pipeline.step_heartbeat import NoHeartbeat, StepHeartbeat, step_heartbeat


class Reports:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[Busy] = []

    def __call__(self, events: list) -> None:
        with self.lock:
            self.events += events

    def take(self) -> list[Busy]:
        with self.lock:
            taken, self.events = self.events, []
        return taken


def test_busy_is_reported_only_while_the_loop_is_busy():
    reports = Reports()
    heartbeat = StepHeartbeat("vocoder", reports, interval_s=0.02)
    try:
        time.sleep(0.1)
        assert reports.take() == []  # idle: waiting for messages
        with heartbeat.busy():
            time.sleep(0.3)
        beats = reports.take()
        assert len(beats) >= 3
        assert all(b.stage == "vocoder" and b.pid > 0 for b in beats)
        times = [b.busy_s for b in beats]
        assert times == sorted(times) and times[-1] > 0.1  # one step, growing
        time.sleep(0.1)
        assert reports.take() == []
        with heartbeat.busy():  # a new step counts from its own start
            time.sleep(0.1)
        assert all(b.busy_s < 0.15 for b in reports.take())
    finally:
        heartbeat.close()
    assert not heartbeat._thread.is_alive()
    with heartbeat.busy():
        time.sleep(0.06)
    assert reports.take() == []  # closed: silent


def test_no_timeout_means_no_heartbeat_thread():
    reports = Reports()
    assert isinstance(step_heartbeat("talker", reports, None), NoHeartbeat)
    heartbeat = step_heartbeat("talker", reports, 0.02)
    try:
        assert isinstance(heartbeat, StepHeartbeat) and heartbeat.interval_s == 0.02
    finally:
        heartbeat.close()
