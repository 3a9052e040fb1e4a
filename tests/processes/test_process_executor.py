"""`ProcessExecutor` against a runner without a model: the worker's replies come back in
send order, its failures name themselves, and a shutdown is a clean exit."""

from __future__ import annotations

import os
import signal

import pytest

from omnistage.child import start_child
from omnistage.core.process_executor import (
    _ENCODER,
    _FROM_WORKER,
    Failed,
    ProcessExecutor,
    Ready,
    RunnerDied,
    RunnerFailed,
    Shutdown,
    Stats,
    StatsQuery,
    Step,
    StepDone,
    _as_user_error,
    worker_main,
)
from omnistage.core.sched_output import CachedRequestData, SchedulerOutput

RUNNER = "tests.processes.child_targets:counting_runner"


def _step(**counts: int) -> SchedulerOutput:
    return SchedulerOutput(
        scheduled_new_reqs=[],
        scheduled_cached_reqs=CachedRequestData(),
        num_scheduled_tokens=counts,
        total_num_scheduled_tokens=sum(counts.values()),
        finished_req_ids=set(),
        preempted_req_ids=set(),
    )


@pytest.fixture
def executor():
    executor = ProcessExecutor(RUNNER, 7)
    yield executor
    executor.shutdown()


def test_steps_in_flight_come_back_in_send_order(executor):
    assert executor.num_kv_blocks == -1 and executor.startup_phases == {}  # not ready yet
    executor.wait_ready()
    assert executor.num_kv_blocks == 7
    assert executor.startup_phases == {"build": 0.25}
    assert executor.child.name == "omnistage model runner worker"
    first, second = executor.submit(_step(a=3, b=1)), executor.submit(_step(b=2))
    assert second.result().sampled_token_ids == [[2]]  # waits for the first on the way
    out = first.result()
    assert (out.req_ids, out.sampled_token_ids) == (["a", "b"], [[3], [1]])
    assert executor.runner_stats() == {"steps": 2}


def test_a_failed_step_raises_the_runners_traceback_and_the_worker_serves_on(executor):
    executor.wait_ready()
    failing, after = executor.submit(_step(boom=1)), executor.submit(_step(c=5))
    with pytest.raises(RunnerFailed, match="model runner worker failed:\n") as info:
        failing.result()
    text = str(info.value)
    assert text.startswith("model runner worker failed:\nTraceback (most recent call last):\n")
    assert text.rstrip().endswith("RuntimeError: boom in the runner")
    assert "execute_model" in text  # the worker's own frame
    assert after.result().sampled_token_ids == [[5]]


def test_a_bad_runner_argument_stays_a_value_error_with_the_workers_traceback():
    executor = ProcessExecutor(RUNNER, 0)
    with pytest.raises(ValueError, match="^num_kv_blocks: 0 cannot hold a request$") as info:
        executor.wait_ready()
    cause = str(info.value.__cause__)
    assert cause.startswith("model runner worker failed to start:\n")
    assert "counting_runner" in cause
    assert executor.child.join(5) is not None  # the failed worker was closed


def test_a_dead_worker_is_named_with_how_it_ended(executor):
    executor.wait_ready()
    os.kill(executor.child.pid, signal.SIGKILL)
    executor.child.join(5)
    with pytest.raises(
        RunnerDied, match="^model runner worker died: omnistage model runner worker"
    ):
        executor.submit(_step(a=1)).result()


def test_a_reply_of_the_wrong_kind_fails_the_step_naming_it():
    child = start_child("tests.processes.child_targets:ready_then_stats", name="odd worker")
    executor = ProcessExecutor(RUNNER, child=child)
    executor.wait_ready()
    assert executor.num_kv_blocks == 3
    with pytest.raises(RunnerFailed, match=r"unexpected reply Stats\(values=\{'x': 1\}\)"):
        executor.execute_model(_step(a=1))
    executor.shutdown()


def test_shutdown_asks_the_worker_to_stop_and_it_exits_cleanly(executor):
    executor.wait_ready()
    executor.shutdown()
    assert executor.child.exitcode == 0


def test_a_worker_that_dies_during_a_step_fails_the_step_naming_the_signal(executor):
    executor.wait_ready()
    pending = executor.submit(_step(slow=1))
    os.kill(executor.child.pid, signal.SIGKILL)
    with pytest.raises(RunnerDied, match="^model runner worker died: .* was killed by SIGKILL"):
        pending.result()


def _serve_in_a_thread(*args):
    """`worker_main` on one end of a pipe, in a thread of this process (what the worker
    process runs, where coverage and mutation testing see it)."""
    import threading
    from multiprocessing import Pipe

    ours, theirs = Pipe()
    thread = threading.Thread(target=worker_main, args=(RUNNER, args, theirs), daemon=True)
    thread.start()
    return ours, thread


def test_the_worker_loop_answers_steps_and_stats_in_order_and_stops_on_shutdown():
    conn, thread = _serve_in_a_thread(4)
    assert _FROM_WORKER.decode(conn.recv_bytes()) == Ready(
        num_kv_blocks=4, startup_phases={"build": 0.25}
    )
    conn.send_bytes(_ENCODER.encode(Step(scheduler_output=_step(a=2))))
    conn.send_bytes(_ENCODER.encode(Step(scheduler_output=_step(boom=1))))
    conn.send_bytes(_ENCODER.encode(StatsQuery()))
    done = _FROM_WORKER.decode(conn.recv_bytes())
    assert isinstance(done, StepDone) and done.runner_output.sampled_token_ids == [[2]]
    failed = _FROM_WORKER.decode(conn.recv_bytes())
    assert isinstance(failed, Failed)
    assert failed.error.startswith("Traceback (most recent call last):\n")
    assert failed.error.rstrip().endswith("RuntimeError: boom in the runner")
    assert _FROM_WORKER.decode(conn.recv_bytes()) == Stats(values={"steps": 1})
    conn.send_bytes(_ENCODER.encode(Shutdown()))
    thread.join(5)
    assert not thread.is_alive()
    conn, thread = _serve_in_a_thread(4, False)  # a runner that does not time its start
    assert _FROM_WORKER.decode(conn.recv_bytes()) == Ready(num_kv_blocks=4, startup_phases={})
    conn.close()
    thread.join(5)


def test_the_worker_loop_reports_a_runner_it_cannot_build_and_ends_when_the_engine_leaves():
    conn, thread = _serve_in_a_thread(0)
    failed = _FROM_WORKER.decode(conn.recv_bytes())
    assert isinstance(failed, Failed)
    assert failed.error.rstrip().endswith("ValueError: num_kv_blocks: 0 cannot hold a request")
    thread.join(5)
    assert not thread.is_alive()
    conn, thread = _serve_in_a_thread(2)
    conn.recv_bytes()
    conn.close()  # the engine is gone: the loop ends on end of file
    thread.join(5)
    assert not thread.is_alive()


def test_a_start_failure_is_the_users_only_when_the_worker_raised_a_value_error():
    trace = "Traceback (most recent call last):\n  ...\n"
    user = _as_user_error(trace + "ValueError: dtype: 'f17' is not a dtype\n")
    assert type(user) is ValueError and str(user) == "dtype: 'f17' is not a dtype"
    assert isinstance(user.__cause__, RunnerFailed)
    assert str(user.__cause__) == "model runner worker failed to start:\n" + trace + (
        "ValueError: dtype: 'f17' is not a dtype\n"
    )
    ours = _as_user_error(trace + "RuntimeError: out of memory\n")
    assert type(ours) is RunnerFailed
    assert (
        str(ours)
        == "model runner worker failed to start:\n" + trace + "RuntimeError: out of memory\n"
    )


def test_stats_the_runner_cannot_give_raise_its_traceback(executor):
    executor.wait_ready()
    executor.execute_model(_step(break_stats=1))
    with pytest.raises(RunnerFailed) as info:
        executor.runner_stats()
    text = str(info.value)
    assert text.startswith("Traceback (most recent call last):\n")
    assert text.rstrip().endswith("RuntimeError: no stats today")
