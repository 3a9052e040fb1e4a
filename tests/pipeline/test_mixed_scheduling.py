"""A pipeline whose AR stages mix sync and async scheduling: each stage is built with its
own kind (and really steps that way), and the outputs and every payload a stage receives
are byte-identical to the all-sync run. Float64 tiny models, greedy.
"""

from __future__ import annotations

import pytest

from omnistage.core.async_scheduler import AsyncScheduler
from omnistage.core.scheduler import Scheduler
from omnistage.testing.tiny_pipeline import tiny_pipeline_deploy
from tests.pipeline.pipeline_runs import AR_STAGES, run_pipeline

PROMPTS = ["hello world", "abc", "the quick brown fox jumps", "omni", "stage by stage"]


def deploy_with_modes(tiny_omni, modes: dict[str, bool], thinker_transfer: str) -> dict:
    """The tiny pipeline with each AR stage's own `async_scheduling` (an async stage's
    runner on a worker thread; a sync one's on the default, inline)."""
    deploy = tiny_pipeline_deploy(tiny_omni, thinker_transfer=thinker_transfer)
    for stage in deploy["stages"]:
        if stage["name"] in modes:
            mode = {"async_scheduling": modes[stage["name"]]}
            if modes[stage["name"]]:
                mode["executor_backend"] = "thread"
            stage["engine_args"] = {**stage["engine_args"], **mode}
    return deploy


@pytest.fixture(scope="module")
def all_sync(tiny_omni):
    """The all-sync run per way the thinker sends to the talker."""
    sync = dict.fromkeys(AR_STAGES, False)
    return {
        t: run_pipeline(deploy_with_modes(tiny_omni, sync, t), PROMPTS)
        for t in ("payload", "stream")
    }


@pytest.mark.parametrize(
    ("modes", "thinker_transfer"),
    [
        ({"thinker": True, "talker": False}, "payload"),
        ({"thinker": False, "talker": True}, "stream"),
    ],
    ids=["async-thinker-payload", "async-talker-stream"],
)
def test_mixed_stages_schedule_each_their_way_with_sync_results(
    tiny_omni, all_sync, modes, thinker_transfer
):
    run = run_pipeline(deploy_with_modes(tiny_omni, modes, thinker_transfer), PROMPTS)
    for stage, is_async in modes.items():
        core, probe = run.cores[stage], run.probes[stage]
        if is_async:
            assert type(core.scheduler) is AsyncScheduler, stage
            assert core.step == core.step_with_batch_queue, stage
            assert probe.most_in_flight == 1 and probe.most_placeholders > 0, stage
        else:
            assert type(core.scheduler) is Scheduler, stage
            assert core.step == core.step_sync, stage
            assert probe.most_in_flight == 0 and probe.most_placeholders == 0, stage
    reference = all_sync[thinker_transfer]
    assert all(probe.most_in_flight == 0 for probe in reference.probes.values())
    assert run.outputs == reference.outputs
    assert run.received_bytes.keys() == reference.received_bytes.keys()
    for key, data in reference.received_bytes.items():
        assert run.received_bytes[key] == data, key
    assert all(v == 0 for c in run.counters.values() for v in c.values()), run.counters
