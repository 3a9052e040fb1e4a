"""`StepHeartbeat`: a stage says it is alive while its loop is busy in a long step.

A stage answers the supervisor's `Ping` between two steps, so a step longer than
`hang_timeout_s` (a vocoder call over 16 long utterances on a loaded CPU) used to read as
a hang, and the stage was killed in the middle of honest work. Now the stage loop marks
what it does between two waits for messages (`with heartbeat.busy():`), and a daemon
thread sends `Busy(stage, busy_s, pid)` every `interval_s` while the loop is busy. The
thread needs the GIL only for a moment, and torch's ops and our C kernels release it, so:

- a stopped or frozen process (SIGSTOP, C code that never releases the GIL) sends nothing:
  the supervisor's `hang_timeout_s` catches it, as before;
- a step that never ends (a deadlock, a stuck device) keeps sending `Busy` with a growing
  `busy_s`: the supervisor's `step_timeout_s` catches it;
- a long step that ends is only a slow stage.

The thread and the loop send through one `report` callable, which must serialize them (a
ZMQ socket may pass between threads only behind a full memory barrier: a lock).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from omnistage.pipeline.messages import Busy


class StepHeartbeat:
    """Sends `Busy` every `interval_s` while the stage loop is inside `busy()`."""

    def __init__(
        self,
        stage: str,
        report: Callable[[list[Any]], None],
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stage, self.report, self.interval_s, self.clock = stage, report, interval_s, clock
        self._since: float | None = None
        """When the loop became busy; None while it waits for messages (one attribute,
        written by the loop and read by the thread: each access is atomic)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._beat, name=f"omnistage heartbeat {stage}", daemon=True
        )
        self._thread.start()

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """The loop's work between two waits for messages (it does not nest)."""
        self._since = self.clock()
        try:
            yield
        finally:
            self._since = None

    def _beat(self) -> None:
        pid = os.getpid()
        while not self._stop.wait(self.interval_s):
            since = self._since
            if since is not None:
                self.report([Busy(stage=self.stage, busy_s=self.clock() - since, pid=pid)])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=max(1.0, 2 * self.interval_s))


class NoHeartbeat:
    """A stage with neither a hang nor a step timeout: nothing watches it."""

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        yield

    def close(self) -> None:
        pass


def step_heartbeat(
    stage: str, report: Callable[[list[Any]], None], interval_s: float | None
) -> StepHeartbeat | NoHeartbeat:
    """A heartbeat every `interval_s` (the restart policy's `heartbeat_interval_s`), or
    none when it is None."""
    return NoHeartbeat() if interval_s is None else StepHeartbeat(stage, report, interval_s)
