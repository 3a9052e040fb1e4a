"""A pipeline request id already in use is refused: the duplicate ends at once with an
error naming the id, and the request that holds it runs on untouched. (`AsyncOmni` is the
frontend that takes callers' ids; `Omni` makes its own.)"""

from __future__ import annotations

import asyncio

from omnistage.pipeline.omni import AsyncOmni
from omnistage.testing.tiny_pipeline import tiny_pipeline_deploy


def test_a_request_id_in_use_is_refused_and_its_request_runs_on(tiny_omni):
    omni = AsyncOmni(tiny_pipeline_deploy(tiny_omni), in_process=True)

    async def collect(prompt: str) -> list:
        return [u async for u in omni.generate(prompt, request_id="dup")]

    async def both() -> list[list]:
        # The first submits before the second does (a task runs until its first wait).
        both = asyncio.gather(collect("hello world"), collect("abc"))
        return await asyncio.wait_for(both, timeout=60)  # a failure, not a hang

    try:
        first, second = asyncio.run(both())
        assert len(second) == 1 and second[0].finished
        assert second[0].error == "request_id: 'dup' is already in use"
        final = first[-1]
        assert final.finished and final.error is None
        assert len(final.token_ids) == 12 and final.audio is not None
        assert all(v == 0 for c in omni.stage_counters().values() for v in c.values())
        # Once it has ended, the id is free again.
        again = asyncio.run(collect("abc"))[-1]
        assert again.finished and again.error is None
    finally:
        omni.shutdown()
