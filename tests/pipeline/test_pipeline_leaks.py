"""Nothing leaks (DESIGN.md invariant 8): 500 mixed requests, a fifth aborted at random
moments — while generating, while streaming, while waiting for input — and afterwards
every counter of every stage is zero and no shared-memory segment is left."""

from __future__ import annotations

import asyncio
import os
import random

import pytest

from omnistage import SamplingParams
from omnistage.pipeline.omni import AsyncOmni
from omnistage.testing.tiny_pipeline import tiny_pipeline_deploy

NUM_REQUESTS = 500


def _workload(rng: random.Random, i: int) -> dict:
    text_only = rng.random() < 0.3
    return {
        "prompt": "".join(rng.choice("abcdefgh ") for _ in range(rng.randint(1, 60))),
        "modalities": ["text"] if text_only else None,
        "sampling_params": {
            "thinker": SamplingParams(
                temperature=rng.choice([0.0, 1.0]), seed=i, max_tokens=rng.randint(1, 16)
            ),
            "talker": SamplingParams(temperature=1.0, seed=i, max_tokens=rng.randint(1, 24)),
        },
        "abort_after": rng.uniform(0, 0.3) if rng.random() < 0.15 else None,
        # Abort right after the first audio chunk: the vocoder is then parked, waiting for
        # the next chunk (WAITING_FOR_INPUT).
        "abort_when_streaming": not text_only and rng.random() < 0.07,
    }


async def _run(omni: AsyncOmni, seed: int) -> tuple[int, int, int, int]:
    rng = random.Random(seed)
    vocoder = omni.orchestrator.clients["vocoder"].core
    aborted_waiting = 0

    async def one(i: int, spec: dict) -> str:
        nonlocal aborted_waiting
        await asyncio.sleep(rng.uniform(0, 1.0))  # random arrival
        request_id = f"req-{i}"
        stream = omni.generate(
            spec["prompt"], spec["sampling_params"], spec["modalities"], request_id=request_id
        )
        if spec["abort_when_streaming"]:
            async for out in stream:
                if out.new_data is not None and not out.finished:
                    if vocoder.coordinator.is_waiting(request_id):
                        aborted_waiting += 1
                    await omni.abort(request_id)
                    async for _ in stream:
                        pass
                    return "aborted"
                if out.finished:  # too short to catch mid-stream
                    assert out.error is None, out.error
                    return "finished"
        if spec["abort_after"] is None:
            async for out in stream:
                if out.finished:
                    assert out.error is None, out.error
            return "finished"

        async def consume():
            async for _ in stream:
                pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(spec["abort_after"])
        if vocoder.coordinator.is_waiting(request_id):
            aborted_waiting += 1
        await omni.abort(request_id)
        await task
        return "aborted"

    specs = [_workload(rng, i) for i in range(NUM_REQUESTS)]
    ends = await asyncio.gather(*(one(i, s) for i, s in enumerate(specs)))
    return ends.count("finished"), ends.count("aborted"), aborted_waiting, len(specs)


@pytest.mark.parametrize(
    ("async_scheduling", "thinker_transfer"),
    [(False, "payload"), (True, "payload"), (True, "stream")],
    ids=["sync", "async", "async-streamed-talker"],
)
def test_counters_return_to_zero_after_mixed_requests_with_aborts(
    tiny_omni, async_scheduling, thinker_transfer
):
    deploy = tiny_pipeline_deploy(
        tiny_omni,
        thinker_transfer=thinker_transfer,
        async_scheduling=async_scheduling,
        executor_backend="thread",
        dtype="float32",
        thinker_tokens=16,
        talker_tokens=24,
    )
    omni = AsyncOmni(deploy, in_process=True)
    namespace = omni.orchestrator.namespace
    try:
        finished, aborted, aborted_waiting, total = asyncio.run(_run(omni, seed=7))
        assert finished + aborted == total
        assert aborted > 0.1 * total
        assert aborted_waiting > 0  # some aborts hit a request parked in WAITING_FOR_INPUT
        counters = omni.stage_counters()
        for stage, values in counters.items():
            assert all(v == 0 for v in values.values()), (stage, values)
        assert omni.orchestrator.num_tracked() == 0
        core = omni.orchestrator.clients["thinker"].core
        runner = core.engine.core.executor.runner
        assert runner.batch.num_rows == 0 and not runner.requests
    finally:
        omni.shutdown()
    assert [n for n in os.listdir("/dev/shm") if namespace in n] == []
