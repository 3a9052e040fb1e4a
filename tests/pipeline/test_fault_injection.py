"""Stage faults are contained (issue 22): a stage process killed, hung, slow, or whose model
raises, in each stage kind of the tiny speech pipeline (thinker and talker: ar; vocoder:
generation) and of the tiny image pipeline (draw: diffusion), each with a process per stage.

Each case checks what a caller sees — a request in flight fails within 5 s with an error
naming the stage (`unavailable`: a 503 on the server), the stage comes back (or, for an
exception, never went away), and the next request gives exactly the output it gave
before — and the counters: the supervisor's restarts and failures, and afterwards nothing
is held anywhere (no request tracked, every stage's resource counters zero: engine
requests, KV blocks, accumulators, coordinator entries, connector buffers; no shared-memory
segment of the pipeline; the orchestrator's open file descriptors back to their count).

Faults inside a model are injected with `OMNISTAGE_FAULTS` (`omnistage/pipeline/faults.py`):
a request whose id holds a stage's marker makes that stage's model call raise (or sleep).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from omnistage import SamplingParams
from omnistage.diffusion.params import DiffusionParams
from omnistage.families.text_to_image.tiny import make_tiny_image_pipeline
from omnistage.pipeline.connectors import payload_key
from omnistage.pipeline.connectors.shm import SharedMemoryConnector, namespace_segments
from omnistage.pipeline.deploy import RestartPolicy
from omnistage.pipeline.faults import FAULTS_ENV
from omnistage.pipeline.omni import AsyncOmni
from omnistage.pipeline.outputs import OmniRequestOutput
from omnistage.testing.tiny_deploys import tiny_image_deploy
from omnistage.testing.tiny_pipeline import tiny_pipeline_deploy

FAULTS = {
    "thinker": {"raise_for": "boom-thinker"},
    "talker": {
        "raise_for": "boom-talker",
        "sleep_for": "slow-",
        "sleep_s": 0.05,
        "stall_for": {"long-step-": 2.5, "stuck-": 30.0},
    },
    "vocoder": {"raise_for": "boom-vocoder", "sleep_for": "slow-", "sleep_s": 0.2},
    "draw": {"raise_for": "boom-draw"},
}
RESTART = {"max_retries": 3, "backoff_s": 0.05, "hang_timeout_s": 1.5, "step_timeout_s": 4.0}
FD_SLACK = 2
"""ZMQ may keep an fd or two of its own (a reaper's, a mailbox) open a while longer."""


def _with_restart(deploy: dict[str, Any]) -> dict[str, Any]:
    for stage in deploy["stages"]:
        stage["restart"] = dict(RESTART)
    return deploy


class Pipeline:
    """An `AsyncOmni` (a process per stage unless `in_process`), and what the checks need
    of it."""

    def __init__(self, deploy: dict[str, Any] | Any, in_process: bool = False) -> None:
        self.omni = AsyncOmni(deploy, in_process=in_process)
        self.orchestrator = self.omni.orchestrator
        self.namespace = self.orchestrator.namespace
        self.fds = 0

    def run(self, prompt: str, request_id: str, **kwargs: Any) -> OmniRequestOutput:
        return asyncio.run(_final(self.omni, prompt, request_id, **kwargs))

    def pid(self, stage: str) -> int:
        return self.orchestrator.clients[stage].pid

    def wait_up(self, timeout: float = 30.0) -> None:
        health = self.orchestrator.health
        _until(lambda: all(h.state == "up" for h in health().values()), timeout, health)

    def assert_clean(self) -> None:
        """Nothing of any request is held anywhere, and every stage is up."""
        self.wait_up()
        _until(lambda: self.orchestrator.num_tracked() == 0, 10, "requests tracked")
        counters = self.omni.stage_counters
        _until(lambda: _all_zero(counters()), 10, lambda: f"stage counters {counters()}")
        assert namespace_segments(self.namespace) == []
        assert self.orchestrator.dead == {}
        _until(lambda: _num_fds() <= self.fds + FD_SLACK, 10, lambda: f"{_num_fds()} fds")


def _all_zero(counters: dict[str, dict[str, int]]) -> bool:
    return all(v == 0 for stage in counters.values() for v in stage.values())


def _num_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _until(condition: Callable[[], bool], timeout: float, what: Any = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out: {what() if callable(what) else what}"
        time.sleep(0.05)


async def _final(omni: AsyncOmni, prompt: str, request_id: str, **kwargs: Any) -> Any:
    last = None
    async for out in omni.generate(prompt, request_id=request_id, **kwargs):
        last = out
    return last


def _fault_midway(
    pipe: Pipeline,
    fault: Callable[[], None],
    started: Callable[[OmniRequestOutput], bool],
    sampling: dict[str, Any],
    prompt: str = "a long one",
) -> tuple[OmniRequestOutput, float]:
    """Run a long request; once `started(update)`, strike with `fault`. Returns the final
    output and the seconds from the fault to the request's end."""

    async def scenario() -> tuple[OmniRequestOutput, float]:
        struck = None
        last = None
        async for out in pipe.omni.generate(prompt, sampling, request_id="long"):
            last = out
            if struck is None and not out.finished and started(out):
                fault()
                struck = time.monotonic()
        assert struck is not None, "the request ended before the fault"
        return last, time.monotonic() - struck

    return asyncio.run(asyncio.wait_for(scenario(), timeout=60))


@pytest.fixture(scope="module")
def speech(tiny_omni) -> Iterator[tuple[Pipeline, OmniRequestOutput]]:
    with pytest.MonkeyPatch.context() as mp:  # while it lasts: restarted stages read it too
        mp.setenv(FAULTS_ENV, json.dumps(FAULTS))
        pipe = Pipeline(_with_restart(tiny_pipeline_deploy(tiny_omni)))
        try:
            baseline = pipe.run("hello", "baseline")
            assert baseline.error is None and baseline.audio is not None
            pipe.fds = _num_fds()
            yield pipe, baseline
        finally:
            pipe.omni.shutdown()
    assert namespace_segments(pipe.namespace) == []


def _same(out: OmniRequestOutput, baseline: OmniRequestOutput) -> None:
    assert out.error is None, out.error
    assert out.token_ids == baseline.token_ids
    assert out.audio is not None and (out.audio == baseline.audio).all()


EDGE_OF = {"thinker": "thinker->talker", "talker": "talker->vocoder", "vocoder": "talker->vocoder"}
"""An edge the killed stage writes or reads. A thinker killed mid-generation has written
nothing its talker saw: only the orchestrator can unlink what it left."""


def _plant_segment(pipe: Pipeline, edge: str) -> None:
    """A shared-memory payload of the request in flight, announced to nobody."""
    shm = SharedMemoryConnector("shm", {}, namespace=pipe.namespace)
    shm.put(payload_key("long", edge, 999), {"ids.prompt": torch.tensor([1, 2, 3])})
    assert len(namespace_segments(pipe.namespace)) >= 1


LONG_THINKER = {"thinker": SamplingParams(temperature=0.0, max_tokens=2000, ignore_eos=True)}
LONG_TALKER = {"talker": SamplingParams(temperature=0.0, max_tokens=900, ignore_eos=True)}


@pytest.mark.parametrize(
    ("stage", "sampling", "started"),
    [
        ("thinker", LONG_THINKER, lambda out: out.stage == "thinker" and bool(out.new_token_ids)),
        ("talker", LONG_TALKER, lambda out: out.new_data is not None),
        ("vocoder", LONG_TALKER, lambda out: out.new_data is not None),
    ],
)
def test_a_killed_stage_fails_its_requests_restarts_and_serves_again(
    speech, stage, sampling, started
):
    pipe, baseline = speech
    before = pipe.orchestrator.health()[stage]
    old_pid = pipe.pid(stage)

    def kill() -> None:
        _plant_segment(pipe, EDGE_OF[stage])  # as if the stage put a payload, then died
        os.kill(old_pid, signal.SIGKILL)

    out, elapsed = _fault_midway(pipe, kill, started, sampling)
    assert out.finished and out.unavailable and elapsed < 5
    assert f"stage {stage!r} died (exit code -9)" in out.error
    pipe.wait_up()
    health = pipe.orchestrator.health()[stage]
    assert (health.restarts, health.failures) == (before.restarts + 1, before.failures + 1)
    assert pipe.pid(stage) != old_pid
    _same(pipe.run("hello", f"after-{stage}"), baseline)
    pipe.assert_clean()


def test_a_hung_stage_is_killed_and_restarted(speech):
    pipe, baseline = speech
    before = pipe.orchestrator.health()["talker"]
    old_pid = pipe.pid("talker")
    try:
        out, elapsed = _fault_midway(
            pipe,
            lambda: os.kill(old_pid, signal.SIGSTOP),
            lambda out: out.new_data is not None,
            LONG_TALKER,
        )
    finally:
        if os.path.exists(f"/proc/{old_pid}"):
            os.kill(old_pid, signal.SIGCONT)
    assert out.unavailable and elapsed < 5
    assert "stage 'talker' stopped answering" in out.error
    pipe.wait_up()
    assert pipe.orchestrator.health()["talker"].restarts == before.restarts + 1
    _same(pipe.run("hello", "after-hang"), baseline)
    pipe.assert_clean()


def test_a_slow_stage_still_completes(speech):
    pipe, baseline = speech
    health = pipe.orchestrator.health()
    started = time.monotonic()
    _same(pipe.run("hello", "slow-1"), baseline)  # talker and vocoder sleep in every step
    assert time.monotonic() - started > 0.4
    assert pipe.orchestrator.health() == health  # slow is not hung: nothing restarted
    pipe.assert_clean()


def test_a_step_longer_than_the_hang_timeout_is_slow_not_hung(speech):
    """One talker step of 2.5 s, the hang timeout 1.5 s: the stage's heartbeat says it is
    busy, so nothing is restarted and the request gives its usual output."""
    pipe, baseline = speech
    health = pipe.orchestrator.health()
    started = time.monotonic()
    _same(pipe.run("hello", "long-step-1"), baseline)
    assert time.monotonic() - started > 2.5
    assert pipe.orchestrator.health() == health
    pipe.assert_clean()


def test_a_step_past_the_step_timeout_is_stuck_and_restarted(speech):
    """A talker step that would take 30 s, the step timeout 4 s: the stage is killed as
    stuck while its heartbeat still says it is busy, and comes back."""
    pipe, baseline = speech
    before = pipe.orchestrator.health()["talker"]
    old_pid = pipe.pid("talker")
    started = time.monotonic()
    out = pipe.run("hello", "stuck-1")
    assert out.unavailable and 4.0 < time.monotonic() - started < 10.0
    assert "stage 'talker' has been busy in one step for" in out.error
    assert "longer than its step_timeout_s (4 s): stuck" in out.error
    pipe.wait_up()
    health = pipe.orchestrator.health()["talker"]
    assert (health.restarts, health.failures) == (before.restarts + 1, before.failures + 1)
    assert pipe.pid("talker") != old_pid
    _same(pipe.run("hello", "after-stall"), baseline)
    pipe.assert_clean()


@pytest.mark.parametrize("stage", ["thinker", "talker", "vocoder"])
def test_an_exception_in_a_model_fails_its_request_and_the_stage_goes_on(speech, stage):
    """The bad request fails; the requests that shared its batch end as if it had not
    been there (an ar stage runs the failed step's requests alone to find the bad one, a
    generation stage its items)."""
    pipe, baseline = speech
    health, pid = pipe.orchestrator.health(), pipe.pid(stage)

    async def bad_among_good() -> list[OmniRequestOutput]:
        ids = ["good-0", f"boom-{stage}", "good-1", "good-2"]
        return await asyncio.gather(*(_final(pipe.omni, "hello", rid) for rid in ids))

    good_0, bad, *good = asyncio.run(bad_among_good())
    assert bad.finished and not bad.unavailable
    assert bad.error.startswith(f"stage {stage}: the step running this request failed")
    assert "InjectedFault" in bad.error
    for out in (good_0, *good):
        _same(out, baseline)
    assert pipe.pid(stage) == pid and pipe.orchestrator.health() == health
    _same(pipe.run("hello", f"next-{stage}"), baseline)
    pipe.assert_clean()


def test_an_exception_in_an_async_ar_step_with_a_worker_process(tiny_omni, monkeypatch):
    """Async scheduling with the runner in a worker process (two batches in flight): the
    failed step's batch in flight is dropped, its requests run alone until the bad one
    fails by itself, the others end as if it had not been there, and the engine is clean."""
    monkeypatch.setenv(FAULTS_ENV, json.dumps(FAULTS))
    deploy = tiny_pipeline_deploy(tiny_omni, async_scheduling=True, executor_backend="process")
    pipe = Pipeline(deploy, in_process=True)
    omni = pipe.omni

    async def run() -> list[OmniRequestOutput]:
        baseline = await _final(omni, "hello", "baseline")
        ids = ["good-0", "boom-talker", "good-1"]
        ran = await asyncio.gather(*(_final(omni, "hello", rid) for rid in ids))
        return [baseline, *ran, await _final(omni, "hello", "next")]

    try:
        baseline, good_0, bad, good_1, next_one = asyncio.run(run())
        pipe.fds = _num_fds()
        assert bad.error.startswith("stage talker: the step running this request failed")
        for out in (good_0, good_1, next_one):
            _same(out, baseline)
        core = omni.orchestrator.clients["talker"].core.engine.core
        assert core.scheduler.isolation.num_failed_steps >= 2  # the batch, then bad alone
        assert core.scheduler.isolation.suspects == []
        assert core.executor.runner_stats()["requests"] == 0
        pipe.assert_clean()
    finally:
        omni.shutdown()


def test_a_request_queued_when_the_orchestrator_fails_ends_with_the_reason(tiny_omni, monkeypatch):
    """The orchestrator's own loop fails while a request waits in its command queue: the
    request ends with the reason (it used to wait forever), and so does a later one."""
    omni = AsyncOmni(tiny_pipeline_deploy(tiny_omni), in_process=True)
    orchestrator, gate = omni.orchestrator, threading.Event()

    def broken_check() -> None:  # the loop stops here, then fails
        gate.wait(10)
        raise RuntimeError("broken loop")

    monkeypatch.setattr(orchestrator.supervisor, "check", broken_check)
    ended: queue.SimpleQueue[OmniRequestOutput] = queue.SimpleQueue()
    try:
        time.sleep(0.2)  # the loop is waiting in broken_check
        orchestrator.submit(omni._request("queued", None, None, "queued"), ended.put)
        gate.set()
        out = ended.get(timeout=10)
        assert out.finished and out.error == "orchestrator failed: broken loop"
        orchestrator.submit(omni._request("later", None, None, "later"), ended.put)
        assert ended.get(timeout=10).error is not None
    finally:
        gate.set()
        omni.shutdown()


# -- diffusion ----------------------------------------------------------------------------------
SMALL = DiffusionParams(height=32, width=32, num_inference_steps=8)
CAT = "a red cat"


def test_diffusion_stage_kill_and_exception(tmp_path_factory):
    """The draw stage of the image demo on its own (it draws the prompt it is given): one
    stage process to start, instead of the thinker's too."""
    ckpt = make_tiny_image_pipeline(tmp_path_factory.mktemp("image"), seed=0, dtype=torch.float64)
    deploy = tiny_image_deploy(ckpt, async_scheduling=False)
    draw = dataclasses.replace(deploy.stage("draw"), restart=RestartPolicy(**RESTART))
    spec = dataclasses.replace(deploy, stages=(draw,), edges=())
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(FAULTS_ENV, json.dumps(FAULTS))
        pipe = Pipeline(spec)
        _diffusion_cases(pipe)
    assert namespace_segments(pipe.namespace) == []


def _diffusion_cases(pipe: Pipeline) -> None:
    try:
        params = {"draw": SMALL}
        baseline = pipe.run(CAT, "baseline", sampling_params=params)
        assert baseline.error is None and baseline.image_array is not None
        pipe.fds = _num_fds()
        old_pid = pipe.pid("draw")
        out, elapsed = _fault_midway(
            pipe,
            lambda: os.kill(old_pid, signal.SIGKILL),
            lambda out: out.progress is not None,
            {"draw": dataclasses.replace(SMALL, progress=True)},
            prompt=CAT,
        )
        assert out.unavailable and elapsed < 5 and "stage 'draw' died" in out.error
        pipe.wait_up()
        assert pipe.orchestrator.health()["draw"].restarts == 1
        again = pipe.run(CAT, "after-kill", sampling_params=params)
        assert (again.image_array == baseline.image_array).all()

        async def bad_among_good() -> list[OmniRequestOutput]:
            ids = ["good-a", "boom-draw", "good-b"]
            runs = (_final(pipe.omni, CAT, rid, sampling_params=params) for rid in ids)
            return await asyncio.gather(*runs)

        good_a, bad, good_b = asyncio.run(bad_among_good())
        assert bad.error.startswith("stage draw: the step running this request failed")
        for good in (good_a, good_b):  # their batch ran again one request per call
            assert good.error is None and (good.image_array == baseline.image_array).all()
        next_one = pipe.run(CAT, "next", sampling_params=params)
        assert (next_one.image_array == baseline.image_array).all()
        assert pipe.orchestrator.health()["draw"].restarts == 1
        pipe.assert_clean()
    finally:
        pipe.omni.shutdown()
