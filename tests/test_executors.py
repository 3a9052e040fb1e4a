"""The in-process executors: `InlineExecutor` runs a step in the caller's thread (its
`submit` hands back a finished future, the runner's error inside it), `ThreadExecutor` on
one worker thread, in submission order."""

from __future__ import annotations

import threading
import time

import pytest

from omnistage.core.executor import InlineExecutor, ThreadExecutor
from omnistage.core.sched_output import CachedRequestData, ModelRunnerOutput, SchedulerOutput


class _Runner:
    num_kv_blocks = 5

    def __init__(self) -> None:
        self.threads: list[str] = []
        self.seen: list[dict[str, int]] = []

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        self.threads.append(threading.current_thread().name)
        counts = scheduler_output.num_scheduled_tokens
        if "boom" in counts:
            raise RuntimeError("boom in the runner")
        self.seen.append(dict(counts))
        ids = list(counts)
        return ModelRunnerOutput(
            req_ids=ids, sampled_token_ids=[[counts[r]] for r in ids], logprobs=[None] * len(ids)
        )

    def stats(self) -> dict[str, int]:
        return {"steps": len(self.seen)}


def _step(**counts: int) -> SchedulerOutput:
    return SchedulerOutput(
        scheduled_new_reqs=[],
        scheduled_cached_reqs=CachedRequestData(),
        num_scheduled_tokens=counts,
        total_num_scheduled_tokens=sum(counts.values()),
        finished_req_ids=set(),
        preempted_req_ids=set(),
    )


def test_inline_submit_runs_the_step_now_and_hands_back_a_finished_future():
    runner = _Runner()
    executor = InlineExecutor(runner)
    assert executor.num_kv_blocks == 5 and executor.startup_phases == {}
    future = executor.submit(_step(a=2))
    assert future.done() and runner.seen == [{"a": 2}]
    assert future.result().sampled_token_ids == [[2]]
    failed = executor.submit(_step(boom=1))
    assert failed.done()
    with pytest.raises(RuntimeError, match="^boom in the runner$"):
        failed.result()
    assert runner.threads == [threading.current_thread().name] * 2
    assert executor.execute_model(_step(b=3)).req_ids == ["b"]
    assert executor.runner_stats() == {"steps": 2}


def test_the_thread_executor_runs_steps_in_order_on_its_own_named_thread():
    runner = _Runner()
    runner.startup_phases = {"load": 1.5}
    executor = ThreadExecutor(runner)
    assert executor.startup_phases == {"load": 1.5}
    futures = [executor.submit(_step(**{f"r{i}": i + 1})) for i in range(5)]
    assert [f.result().sampled_token_ids for f in futures] == [[[i + 1]] for i in range(5)]
    assert runner.seen == [{f"r{i}": i + 1} for i in range(5)]
    assert {name.startswith("omnistage-runner") for name in runner.threads} == {True}
    executor.shutdown()
    with pytest.raises(RuntimeError):  # shut down: no step runs any more
        executor.submit(_step(a=1))


class _SlowRunner(_Runner):
    """Each step takes a while and logs when it starts and ends."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[str] = []

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        (req_id,) = scheduler_output.num_scheduled_tokens
        self.events.append(f"start {req_id}")
        time.sleep(0.02)
        self.events.append(f"end {req_id}")
        return super().execute_model(scheduler_output)


def test_the_thread_executor_never_runs_two_steps_at_once():
    runner = _SlowRunner()
    executor = ThreadExecutor(runner)
    futures = [executor.submit(_step(**{f"r{i}": 1})) for i in range(4)]
    for future in futures:
        future.result()
    expected = [e for i in range(4) for e in (f"start r{i}", f"end r{i}")]
    assert runner.events == expected  # one step at a time, in submission order
    executor.shutdown()


def test_shutdown_waits_for_the_step_that_is_running():
    runner = _SlowRunner()
    executor = ThreadExecutor(runner)
    future = executor.submit(_step(a=1))
    executor.shutdown()
    assert future.done() and runner.events == ["start a", "end a"]
