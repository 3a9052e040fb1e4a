"""Functions the child-process tests run in `python -m omnistage.child` processes."""

from __future__ import annotations

import ctypes
import time
from multiprocessing.connection import Connection


def echo(prefix: str, channel: Connection) -> None:
    """Answer every message with `prefix` + it, until the parent closes the channel."""
    while True:
        try:
            message = channel.recv_bytes()
        except EOFError:
            return
        channel.send_bytes(prefix.encode() + message)


def fail_with_runtime_error(channel: Connection) -> None:
    raise RuntimeError("boom from the child")


def fail_with_value_error(channel: Connection) -> None:
    raise ValueError("max_model_len: too large for this child")


def crash_with_segfault(channel: Connection) -> None:
    ctypes.string_at(0)


def exit_quietly(code: int, channel: Connection) -> None:
    raise SystemExit(code)


class CountingRunner:
    """A model runner without a model, for `ProcessExecutor` tests: each step samples, per
    scheduled request, the number of tokens scheduled for it; a request named "boom" makes
    the step raise, one named "slow" makes it take a minute, one named "break_stats" makes
    every later `stats()` raise."""

    def __init__(self, num_kv_blocks: int) -> None:
        self.num_kv_blocks = num_kv_blocks
        self.startup_phases = {"build": 0.25}
        self.steps = 0
        self.stats_broken = False

    def execute_model(self, scheduler_output):
        from omnistage.core.sched_output import ModelRunnerOutput

        if "boom" in scheduler_output.num_scheduled_tokens:
            raise RuntimeError("boom in the runner")
        if "slow" in scheduler_output.num_scheduled_tokens:
            time.sleep(60)
        if "break_stats" in scheduler_output.num_scheduled_tokens:
            self.stats_broken = True
        self.steps += 1
        ids = list(scheduler_output.num_scheduled_tokens)
        counts = [[scheduler_output.num_scheduled_tokens[r]] for r in ids]
        return ModelRunnerOutput(req_ids=ids, sampled_token_ids=counts, logprobs=[None] * len(ids))

    def stats(self) -> dict[str, int]:
        if self.stats_broken:
            raise RuntimeError("no stats today")
        return {"steps": self.steps}


def counting_runner(num_kv_blocks: int, timed: bool = True) -> CountingRunner:
    """A `CountingRunner`; `timed=False`: one without `startup_phases` (they are optional)."""
    if num_kv_blocks < 1:
        raise ValueError(f"num_kv_blocks: {num_kv_blocks} cannot hold a request")
    runner = CountingRunner(num_kv_blocks)
    if not timed:
        del runner.startup_phases
    return runner


def ready_then_stats(channel: Connection) -> None:
    """A worker that answers its first step with the wrong message (Stats, not StepDone)."""
    from omnistage.core.process_executor import _ENCODER, Ready, Stats

    channel.send_bytes(_ENCODER.encode(Ready(num_kv_blocks=3)))
    channel.recv_bytes()
    channel.send_bytes(_ENCODER.encode(Stats(values={"x": 1})))
    channel.recv_bytes()


def report_openmp_env(channel: Connection) -> None:
    """Send the OpenMP spin settings this child started with."""
    import os

    channel.send((os.environ.get("GOMP_SPINCOUNT"), os.environ.get("OMP_WAIT_POLICY")))
