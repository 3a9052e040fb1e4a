"""The sync/async switch is really thrown, and async is the default.

Every "sync equals async" test compares an engine built with `async_scheduling=False`
with one built with `True`; if the flag were ignored they would compare a mode with
itself and pass. These tests watch the engines work (`SchedulingProbe`): with async
scheduling a step is scheduled while the previous one's results are not applied yet,
its tokens counted as placeholders; with sync scheduling never. A pipeline whose
stages mix the modes is checked in tests/pipeline/test_mixed_scheduling.py.
"""

from __future__ import annotations

import pytest

from omnistage import LLM, SamplingParams
from omnistage.config import EngineConfig
from omnistage.core.async_scheduler import AsyncScheduler
from omnistage.core.executor import InlineExecutor, ThreadExecutor
from omnistage.core.process_executor import ProcessExecutor
from omnistage.core.scheduler import Scheduler
from tests.scheduling_probe import SchedulingProbe

PROMPTS = [{"prompt_token_ids": list(range(5 + i, 25 + 3 * i))} for i in range(4)]
PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
MODES = {
    "sync": {"async_scheduling": False},
    "async": {"async_scheduling": True, "executor_backend": "thread"},
    "default": {},
}
"""Engine arguments per mode: "default" says nothing about scheduling (its runner runs in a
worker process); "async" names a worker thread, which starts faster."""


@pytest.fixture(scope="module")
def llms(tiny_llama_f64):
    made = {
        mode: LLM(str(tiny_llama_f64), dtype="float64", max_model_len=128, **args)
        for mode, args in MODES.items()
    }
    yield made
    for llm in made.values():
        llm.engine.shutdown()


def generate(llm: LLM) -> tuple[SchedulingProbe, list[list[int]]]:
    with SchedulingProbe(llm.engine.core) as probe:
        outputs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    return probe, [list(o.outputs[0].token_ids) for o in outputs]


def test_async_scheduling_is_the_default():
    config = EngineConfig(model="unused")
    assert config.async_scheduling is True
    assert config.resolved_executor_backend == "process"
    sync = EngineConfig(model="unused", async_scheduling=False)
    assert sync.resolved_executor_backend == "inline"


def test_sync_scheduling_never_schedules_ahead(llms):
    core = llms["sync"].engine.core
    assert type(core.scheduler) is Scheduler
    assert core.step == core.step_sync
    assert type(core.executor) is InlineExecutor
    probe, _ = generate(llms["sync"])
    assert len(probe.in_flight_at_schedule) > len(PROMPTS)  # it really stepped
    # Every step was scheduled after the previous one's tokens were applied; no token was
    # ever counted as in flight.
    assert probe.most_in_flight == 0
    assert probe.most_placeholders == 0


@pytest.mark.parametrize(
    ("mode", "executor"), [("async", ThreadExecutor), ("default", ProcessExecutor)]
)
def test_async_scheduling_overlaps_batches(llms, mode, executor):
    core = llms[mode].engine.core
    assert type(core.scheduler) is AsyncScheduler
    assert core.step == core.step_with_batch_queue
    assert type(core.executor) is executor
    probe, tokens = generate(llms[mode])
    # Step N+1 was scheduled while step N ran, never more than one ahead: each request then
    # had two tokens in flight, counted as placeholders (step N's and step N+1's).
    assert probe.most_in_flight == 1
    assert probe.most_placeholders == 2 * len(PROMPTS)
    assert probe.in_flight_at_schedule.count(1) > len(PROMPTS)
    # ... and it gives the sync engine's tokens.
    assert tokens == generate(llms["sync"])[1]
