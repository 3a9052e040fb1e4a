"""The pipeline with a process per stage: same outputs as in-process, a crashed stage
with no restarts left, timeouts, and a clean shutdown (no orphan processes, no
shared-memory segments). Restarts and the other faults: `test_fault_injection.py`."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from omnistage.pipeline.omni import AsyncOmni, Omni
from omnistage.testing.tiny_pipeline import tiny_pipeline_deploy
from tests.process_helpers import descendants

PROMPTS = ["hello world", "abc", "the quick brown fox jumps", "omni"]


def shm_segments(namespace: str) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if namespace in n]


def outputs_of(results):
    return [(o.error, o.token_ids, None if o.audio is None else o.audio.tobytes()) for o in results]


@pytest.fixture(scope="module")
def expected(tiny_omni):
    with Omni(tiny_pipeline_deploy(tiny_omni), in_process=True) as omni:
        return outputs_of(omni.generate(PROMPTS))


@pytest.mark.parametrize("thinker_transfer", ["payload", "stream"])
def test_async_stage_processes_match_in_process_and_shut_down_cleanly(
    tiny_omni, expected, thinker_transfer
):
    if thinker_transfer == "stream":
        deploy = tiny_pipeline_deploy(tiny_omni, thinker_transfer="stream")
        with Omni(deploy, in_process=True) as omni:
            expected = outputs_of(omni.generate(PROMPTS))
    before = descendants(os.getpid())
    omni = Omni(  # with runner worker processes too
        tiny_pipeline_deploy(tiny_omni, async_scheduling=True, thinker_transfer=thinker_transfer)
    )
    namespace = omni.orchestrator.namespace
    try:
        assert outputs_of(omni.generate(PROMPTS)) == expected
        counters = omni.stage_counters()
        assert all(v == 0 for c in counters.values() for v in c.values()), counters
        assert len(descendants(os.getpid()) - before) >= 5  # 3 stages + 2 runner workers
    finally:
        omni.shutdown()
    deadline = time.monotonic() + 10
    while descendants(os.getpid()) - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert descendants(os.getpid()) - before == set()
    assert shm_segments(namespace) == []


def test_a_killed_stage_out_of_restarts_stays_down_and_the_rest_serves_on(tiny_omni):
    deploy = tiny_pipeline_deploy(tiny_omni, talker_tokens=900)
    deploy["stages"][1]["restart"] = {"max_retries": 0}  # restarts: test_fault_injection.py
    omni = AsyncOmni(deploy)
    namespace = omni.orchestrator.namespace
    talker_pid = omni.orchestrator.clients["talker"].process.pid

    async def scenario():
        streaming = asyncio.Event()
        started: set[str] = set()

        async def collect(prompt, modalities=None):
            last = None
            async for out in omni.generate(prompt, modalities=modalities):
                last = out
                if out.new_data is not None:  # audio is flowing for this request
                    started.add(out.request_id)
                    if len(started) == len(PROMPTS):
                        streaming.set()
            return last

        speech = [asyncio.create_task(collect(p)) for p in PROMPTS]
        await asyncio.wait_for(streaming.wait(), timeout=60)
        os.kill(talker_pid, signal.SIGKILL)  # mid-stream: ~900 codes per request still to go
        t0 = time.monotonic()
        failed = await asyncio.wait_for(asyncio.gather(*speech), timeout=30)
        elapsed = time.monotonic() - t0
        text_only = await collect("still here?", modalities=["text"])
        return failed, elapsed, text_only

    try:
        failed, elapsed, text_only = asyncio.run(scenario())
        for out in failed:
            assert out.finished and out.unavailable
            assert "stage 'talker' died (exit code -9); it is down" in out.error
        assert elapsed < 5
        assert text_only.error is None and len(text_only.token_ids) == 12  # the rest serves on
        refused = asyncio.run(_first_output(omni, "needs the talker"))
        assert refused.unavailable and "stage 'talker' died" in refused.error
        health = omni.orchestrator.health()["talker"]
        assert (health.state, health.restarts, health.failures) == ("down", 0, 1)
    finally:
        omni.shutdown()
    assert shm_segments(namespace) == []


async def _first_output(omni, prompt):
    async for out in omni.generate(prompt):
        return out


def test_input_wait_timeout_fails_the_request_with_a_clear_message(tiny_omni):
    deploy = tiny_pipeline_deploy(tiny_omni, talker_tokens=600, input_timeout_s=2.0)
    omni = AsyncOmni(deploy)
    talker_pid = omni.orchestrator.clients["talker"].process.pid

    async def scenario():
        outputs, stopped = [], False
        async for out in omni.generate("wait for me"):
            outputs.append(out)
            if out.new_data is not None and not stopped:
                os.kill(talker_pid, signal.SIGSTOP)  # the producer stalls mid-stream
                stopped = True
        return outputs

    try:
        outputs = asyncio.run(asyncio.wait_for(scenario(), timeout=60))
        final = outputs[-1]
        assert final.finished
        assert (
            final.error
            == "stage vocoder: no input from stage talker on edge talker->vocoder within 2 s"
        )
    finally:
        os.kill(talker_pid, signal.SIGCONT)
        omni.shutdown()
