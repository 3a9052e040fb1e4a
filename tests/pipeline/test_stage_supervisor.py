"""The stage supervisor's policy on a fake clock and fake stage processes: restarts back off
exponentially up to `max_backoff_s`, a stage that fails `max_retries` times in a row is
given up (down), a stage that stays up `reset_after_s` starts afresh, a silent stage is
pinged and then killed as hung, a busy one is alive until its step outlasts the step timeout,
and a late word of a reaped process changes nothing."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

from omnistage.pipeline.deploy import RestartPolicy, load_deploy
from omnistage.pipeline.messages import Busy, Ping, Pong, StageFatal, StageReady
from omnistage.pipeline.stage_supervisor import StageSupervisor
from omnistage.testing.tiny_pipeline import tiny_pipeline_deploy


@dataclass
class FakeClient:
    pid: int
    code: int | None = None

    def exit_code(self) -> int | None:
        return self.code


@dataclass
class FakeStages:
    """What the supervisor uses of a `StageSet`."""

    clients: dict[str, FakeClient]
    in_process: bool = False
    sent: list[tuple[str, object]] = field(default_factory=list)
    reaped: list[int] = field(default_factory=list)
    next_pid: int = 100

    def send(self, name: str, msg: object) -> None:
        self.sent.append((name, msg))

    def reap(self, name: str) -> str:
        self.reaped.append(self.clients[name].pid)
        return "killed"

    def restart(self, name: str) -> None:
        self.next_pid += 1
        self.clients[name] = FakeClient(self.next_pid)

    @staticmethod
    def stage_of(instance: str) -> str:
        return instance.split("#", 1)[0]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _supervised(policy: RestartPolicy) -> tuple[StageSupervisor, FakeStages, Clock, list]:
    spec = load_deploy(tiny_pipeline_deploy("/nowhere"))
    stages = FakeStages({s.name: FakeClient(i + 1) for i, s in enumerate(spec.stages)})
    spec = dataclasses.replace(
        spec, stages=tuple(dataclasses.replace(s, restart=policy) for s in spec.stages)
    )
    calls: list = []
    clock = Clock()
    supervisor = StageSupervisor(
        spec,
        stages,  # type: ignore[arg-type]
        lambda name, reason: calls.append(("down", name, reason)),
        lambda name: calls.append(("up", name)),
        startup_timeout_s=30.0,
        clock=clock,
    )
    return supervisor, stages, clock, calls


def _tick(supervisor: StageSupervisor, clock: Clock, seconds: float, step: float = 0.05) -> None:
    end = clock.now + seconds
    while clock.now < end - 1e-9:
        clock.now = min(clock.now + step, end)
        supervisor.check()


def test_backoff_doubles_then_the_stage_is_given_up():
    policy = RestartPolicy(max_retries=3, backoff_s=0.5, max_backoff_s=1.5, hang_timeout_s=None)
    supervisor, stages, clock, calls = _supervised(policy)
    starts = []
    for attempt in range(1, 5):
        stages.clients["talker"].code = -9
        died_at = clock.now + 0.05
        pid = stages.clients["talker"].pid
        _tick(supervisor, clock, 0.05)
        assert calls[-1][:2] == ("down", "talker") and stages.reaped[-1] == pid
        if attempt == 4:
            break
        assert f"(exit code -9); restarting it (try {attempt} of 3)" in calls[-1][2]
        assert supervisor.health["talker"].state == "restarting"
        while stages.clients["talker"].pid == pid:
            _tick(supervisor, clock, 0.05)
        starts.append(round(clock.now - died_at, 2))
    assert starts == pytest.approx([0.5, 1.0, 1.5], abs=0.06)  # doubled, capped
    assert "it is down after 3 restarts in a row" in calls[-1][2]
    health = supervisor.health["talker"]
    assert (health.state, health.restarts, health.failures) == ("down", 3, 4)
    _tick(supervisor, clock, 60)  # a stage given up is never tried again
    assert supervisor.health["talker"].restarts == 3 and not [c for c in calls if c[0] == "up"]


def test_ready_ends_a_restart_and_a_stage_up_long_enough_starts_afresh():
    policy = RestartPolicy(max_retries=1, backoff_s=0.1, reset_after_s=10.0, hang_timeout_s=None)
    supervisor, stages, clock, calls = _supervised(policy)
    for _ in range(3):  # one retry allowed, but each time the stage stays up 10 s first
        stages.clients["vocoder"].code = -9
        _tick(supervisor, clock, 0.5)
        new = stages.clients["vocoder"]
        supervisor.heard(StageReady(stage="vocoder", pid=new.pid - 1))  # not the new process
        assert supervisor.health["vocoder"].state == "restarting"
        supervisor.heard(StageReady(stage="vocoder", pid=new.pid))
        assert supervisor.health["vocoder"].state == "up" and calls[-1] == ("up", "vocoder")
        _tick(supervisor, clock, 10.0, step=1.0)
    assert supervisor.health["vocoder"].restarts == 3


def test_a_fatal_report_fails_the_stage_and_a_late_one_changes_nothing():
    supervisor, stages, clock, calls = _supervised(RestartPolicy(backoff_s=0.1))
    old = stages.clients["thinker"].pid
    supervisor.heard(StageFatal(stage="thinker", message="RuntimeError: boom", pid=old))
    assert "stage 'thinker' failed: RuntimeError: boom" in calls[-1][2]
    _tick(supervisor, clock, 0.2)
    supervisor.heard(StageFatal(stage="thinker", message="late", pid=old))  # reaped already
    assert supervisor.health["thinker"].failures == 1
    supervisor.heard(StageReady(stage="thinker", pid=stages.clients["thinker"].pid))
    assert supervisor.health["thinker"].state == "up"


@pytest.mark.parametrize("answers", [True, False])
def test_a_silent_stage_is_pinged_then_killed_as_hung(answers):
    supervisor, stages, clock, calls = _supervised(RestartPolicy(hang_timeout_s=2.0))
    for _ in range(60):  # 3 s
        _tick(supervisor, clock, 0.05)
        pings = [name for name, msg in stages.sent if isinstance(msg, Ping)]
        if answers and pings:
            stages.sent.clear()
            for name in set(pings):
                supervisor.heard(Pong(stage=name))
    if answers:
        assert all(h.state == "up" for h in supervisor.health.values()) and not calls
    else:
        assert [c[1] for c in calls] == ["thinker", "talker", "vocoder"]
        assert all("stopped answering for 2.0 s (hung)" in c[2] for c in calls)
        assert len(stages.reaped) == 3


def test_a_busy_stage_is_alive_until_its_step_outlasts_the_step_timeout():
    """A stage in one long step says `Busy` (its heartbeat thread), never `Pong`: it stays up
    past `hang_timeout_s`, and fails as stuck once the step runs past `step_timeout_s`;
    a reaped process's late `Busy` changes nothing."""
    policy = RestartPolicy(hang_timeout_s=2.0, step_timeout_s=10.0, backoff_s=0.1)
    supervisor, stages, clock, calls = _supervised(policy)
    pids = {name: client.pid for name, client in stages.clients.items()}
    step_started = clock.now
    while not calls:
        _tick(supervisor, clock, 0.5)
        for name, pid in pids.items():
            supervisor.heard(Busy(stage=name, busy_s=clock.now - step_started, pid=pid))
    assert clock.now == pytest.approx(10.5)  # 5x the hang timeout, silent for pings
    assert [c[1] for c in calls] == ["thinker", "talker", "vocoder"]
    assert all("busy in one step for 10.5 s" in c[2] and "stuck" in c[2] for c in calls)
    assert sorted(stages.reaped) == sorted(pids.values())
    supervisor.heard(Busy(stage="talker", busy_s=99.0, pid=pids["talker"]))  # reaped already
    assert supervisor.health["talker"].failures == 1


def test_a_stage_with_no_step_timeout_may_be_busy_forever():
    supervisor, _, clock, calls = _supervised(
        RestartPolicy(hang_timeout_s=2.0, step_timeout_s=None)
    )
    for _ in range(40):  # 20 s, busy all along
        _tick(supervisor, clock, 0.5)
        for name in ("thinker", "talker", "vocoder"):
            supervisor.heard(Busy(stage=name, busy_s=clock.now, pid=0))
    assert not calls and all(h.state == "up" for h in supervisor.health.values())


@pytest.mark.parametrize(
    ("hang", "step", "interval"),
    [(60.0, 600.0, 5.0), (1.5, 4.0, 0.375), (None, 8.0, 2.0), (None, None, None)],
)
def test_the_heartbeat_interval_is_a_quarter_of_the_shorter_timeout(hang, step, interval):
    policy = RestartPolicy(hang_timeout_s=hang, step_timeout_s=step)
    assert policy.heartbeat_interval_s == interval


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), "10", True])
def test_a_bad_step_timeout_is_a_value_error_naming_it(bad):
    with pytest.raises(ValueError, match="step_timeout_s: expected a finite number > 0"):
        RestartPolicy(step_timeout_s=bad)
