"""`StageSupervisor`: notices a stage process that died or hangs, and restarts it.

The orchestrator's thread calls `heard` with every event a stage reports and `check`
once per loop. A stage is *up*, *restarting* or *down*::

    up ──(exit code, StageFatal, silent for hang_timeout_s, or busy in one step past
          step_timeout_s: SIGKILL)──▶ restarting
    restarting ──(backoff, then a new process reports StageReady)──▶ up
    restarting ──(max_retries tries in a row spent)──▶ down (for good)

When a stage leaves *up*, `on_down(stage, reason)` runs first — the orchestrator fails
every request that needs the stage at once, naming it, and releases what they held —
then the dead process is reaped (SIGKILL if it still runs; its traceback logged). A
try happens `backoff_s * 2**(n-1)` seconds (at most `max_backoff_s`) after failure n of
a run; a start-up that fails or does not report ready within the start-up timeout is
the next failure. A stage that stays up `reset_after_s` starts its run afresh. When a
stage is up again `on_up(stage)` runs. Each stage's `StageHealth` is published as an
immutable snapshot (`health`), which any thread may read. Stages that run in the
orchestrator's process are not supervised: they cannot die on their own.

A stage is silent only when its process is stopped or frozen: between steps it answers
pings, and during a step its heartbeat thread reports `Busy` (`step_heartbeat.py`), whose
running time `step_timeout_s` bounds.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from omnistage.pipeline.deploy import DeploySpec, RestartPolicy, StageSpec
from omnistage.pipeline.messages import Busy, FromStage, Ping, StageFatal, StageReady
from omnistage.pipeline.stage_set import StageSet

logger = logging.getLogger(__name__)
StageState = Literal["up", "restarting", "down"]


@dataclass(frozen=True)
class StageHealth:
    """One stage as the supervisor sees it (what /health and the metrics report)."""

    state: StageState
    restarts: int = 0
    """Times the stage's process was started again."""
    failures: int = 0
    """Times it died, hung or failed to start."""
    reason: str | None = None
    """The last failure, or None."""


@dataclass
class _Watch:
    """The supervisor's state of one stage."""

    policy: RestartPolicy
    state: StageState = "up"
    pid: int = 0
    run: int = 0
    """Failures in the current run (reset after `reset_after_s` up)."""
    up_since: float = 0.0
    restart_at: float | None = None
    """Restarting: when to start the new process (None once it started)."""
    starting_since: float | None = None
    last_heard: float = 0.0
    last_ping: float = 0.0
    restarts: int = 0
    failures: int = 0
    reason: str | None = None


class StageSupervisor:
    def __init__(
        self,
        deploy: DeploySpec,
        stages: StageSet,
        on_down: Callable[[str, str], None],
        on_up: Callable[[str], None],
        startup_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stages = stages
        self.on_down, self.on_up = on_down, on_up
        self.startup_timeout_s = startup_timeout_s
        self.clock = clock
        now = clock()
        self._watches = {
            name: _Watch(_policy(s, stages), pid=_pid(stages, name), up_since=now, last_heard=now)
            for name in stages.clients
            for s in [deploy.stage(stages.stage_of(name))]
        }
        self.health: dict[str, StageHealth] = {}
        """Each stage's health (a new dict at each change: safe to read from any thread)."""
        self._publish()

    @property
    def supervised(self) -> bool:
        return not self.stages.in_process

    def is_up(self, name: str) -> bool:
        return self._watches[name].state == "up"

    # -- events (the orchestrator's thread) -----------------------------------------------
    def heard(self, event: FromStage) -> None:
        """A stage reported something: it is alive; `StageReady` ends a restart, a
        `StageFatal` of its current process is a failure."""
        watch = self._watches.get(event.stage)
        if watch is None or not self.supervised:
            return
        watch.last_heard = self.clock()
        if isinstance(event, Busy):
            self._heard_busy(event, watch)
        if not isinstance(event, StageReady | StageFatal):
            return
        starting = watch.state == "restarting" and watch.starting_since is not None
        if isinstance(event, StageReady) and starting and watch.pid in (0, event.pid):
            watch.pid = event.pid  # a Ray actor's new pid is known only from its report
            self._now_up(event.stage, watch)
        elif isinstance(event, StageFatal) and self._current(watch, event.pid, starting):
            self._failed(event.stage, f"stage {event.stage!r} failed: {event.message}")

    def _heard_busy(self, event: Busy, watch: _Watch) -> None:
        """A step that has run past `step_timeout_s` is stuck: the stage fails like a hung
        one (a busy stage is alive, so silence never catches this)."""
        limit = watch.policy.step_timeout_s
        if limit is None or event.busy_s <= limit or not self._current(watch, event.pid, False):
            return
        self._failed(
            event.stage,
            f"stage {event.stage!r} has been busy in one step for {event.busy_s:.1f} s, "
            f"longer than its step_timeout_s ({limit:g} s): stuck",
        )

    @staticmethod
    def _current(watch: _Watch, pid: int, starting: bool) -> bool:
        """A report of the stage's current process (not a late word of one reaped)?"""
        return (pid in (0, watch.pid) or starting and not watch.pid) and (
            watch.state == "up" or starting
        )

    def check(self) -> None:
        """Notice deaths, hangs and start-up failures; ping idle stages; start due tries."""
        if not self.supervised:
            return
        now = self.clock()
        for name, watch in self._watches.items():
            if watch.state == "up":
                self._check_up(name, watch, now)
            elif watch.state == "restarting":
                self._check_restart(name, watch, now)

    def _check_up(self, name: str, watch: _Watch, now: float) -> None:
        code = self.stages.clients[name].exit_code()
        if code is not None:
            self._failed(name, f"stage {name!r} died (exit code {code})")
            return
        if watch.run and now - watch.up_since >= watch.policy.reset_after_s:
            watch.run = 0
        hang = watch.policy.hang_timeout_s
        if hang is None:
            return
        silent = now - watch.last_heard
        if silent > hang:
            self._failed(name, f"stage {name!r} stopped answering for {silent:.1f} s (hung)")
            return
        interval = watch.policy.heartbeat_interval_s or hang
        if silent >= interval and now - watch.last_ping >= interval:
            watch.last_ping = now
            self.stages.send(name, Ping())

    def _check_restart(self, name: str, watch: _Watch, now: float) -> None:
        if watch.restart_at is not None:
            if now >= watch.restart_at:
                self._start(name, watch, now)
            return
        code = self.stages.clients[name].exit_code()
        if code is not None:
            self._failed(name, f"stage {name!r} exited while restarting (exit code {code})")
        elif (
            watch.starting_since is not None and now - watch.starting_since > self.startup_timeout_s
        ):
            self._failed(
                name,
                f"stage {name!r} was not ready within {self.startup_timeout_s:g} s of a restart",
            )

    # -- transitions ----------------------------------------------------------------------
    def _failed(self, name: str, reason: str) -> None:
        """The stage's current process failed: fail its requests, reap it, and schedule the
        next try (or give the stage up)."""
        watch = self._watches[name]
        watch.failures += 1
        watch.run += 1
        watch.reason = reason
        policy = watch.policy
        if watch.run > policy.max_retries:
            watch.state, watch.restart_at = "down", None
            tries = f"after {policy.max_retries} restarts in a row" if policy.max_retries else ""
            told = f"{reason}; it is down{' ' + tries if tries else ''}"
        else:
            wait = policy.backoff(watch.run)
            watch.state, watch.restart_at = "restarting", self.clock() + wait
            told = f"{reason}; restarting it (try {watch.run} of {policy.max_retries})"
        watch.starting_since = None
        self._publish()
        logger.error("%s", told)
        self.on_down(name, told)  # first: the requests that need the stage fail now
        how = self.stages.reap(name)
        logger.error("stage %s ended: %s", name, how)

    def _start(self, name: str, watch: _Watch, now: float) -> None:
        watch.restart_at = None
        try:
            self.stages.restart(name)
        except Exception as exc:  # could not even spawn it: the next failure of the run
            logger.exception("restarting stage %s", name)
            self._failed(name, f"stage {name!r} could not be restarted: {exc}")
            return
        watch.starting_since, watch.pid = now, _pid(self.stages, name)
        watch.restarts += 1
        self._publish()

    def _now_up(self, name: str, watch: _Watch) -> None:
        now = self.clock()
        watch.state, watch.starting_since, watch.up_since = "up", None, now
        watch.last_heard = watch.last_ping = now
        self._publish()
        logger.warning("stage %s is up again (restart %d)", name, watch.restarts)
        self.on_up(name)

    def _publish(self) -> None:
        self.health = {
            name: StageHealth(w.state, w.restarts, w.failures, w.reason)
            for name, w in self._watches.items()
        }


def _policy(spec: StageSpec, stages: StageSet) -> RestartPolicy:
    """A Ray stage's replicas are restarted by Ray (`ray.max_restarts` times, with its own
    backoff): the supervisor only waits for them to report ready again."""
    if spec.ray is None or stages.in_process:
        return spec.restart
    return dataclasses.replace(spec.restart, max_retries=spec.ray.max_restarts, backoff_s=0.0)


def _pid(stages: StageSet, name: str) -> int:
    return int(getattr(stages.clients[name], "pid", 0))
