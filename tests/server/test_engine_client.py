"""AsyncEngineClient on its own: streams, aborts that free the KV cache, shutdown."""

from __future__ import annotations

import asyncio
import time

import pytest

from omnistage.config import EngineConfig
from omnistage.core.process_executor import RunnerFailed
from omnistage.engine.llm_engine import LLMEngine
from omnistage.entrypoints.openai.engine_client import AsyncEngineClient, EngineDeadError
from omnistage.sampling_params import SamplingParams


async def _wait_idle(client: AsyncEngineClient) -> None:
    deadline = time.monotonic() + 10
    while True:
        stats = await asyncio.to_thread(client.fresh_stats)
        if not stats.num_unfinished and not stats.kv_blocks_used:
            return
        assert time.monotonic() < deadline, stats
        await asyncio.sleep(0.02)


def test_streams_aborts_and_shutdown(tiny_llama):
    engine = LLMEngine(EngineConfig(str(tiny_llama), max_model_len=128, async_scheduling=False))
    client = AsyncEngineClient(engine)
    params = SamplingParams(max_tokens=100, ignore_eos=True, seed=1, n=2)

    async def run() -> None:
        client.start()
        whole = await client.add_request("hello", SamplingParams(max_tokens=5, ignore_eos=True))
        deltas = [d async for d in whole]
        assert (
            deltas[-1].finished and sum(len(s.token_ids) for d in deltas for s in d.sequences) == 5
        )
        # leaving a stream early aborts the request
        stream = await client.add_request([5, 6, 7], params)
        async with stream:
            first = await anext(stream)
            assert first.num_prompt_tokens == 3 and not first.finished
        await _wait_idle(client)
        assert engine.num_free_kv_blocks() == engine.num_usable_kv_blocks()
        # bad input is the engine's ValueError, before anything runs
        with pytest.raises(ValueError, match="max_tokens: the prompt"):
            await client.add_request("x", SamplingParams(max_tokens=1000))
        with pytest.raises(ValueError, match="prompt_token_ids"):
            await client.add_request([10_000], params)
        # shutting down ends running streams with "abort" and refuses new requests
        running = await client.add_request("abc", params)
        client.begin_shutdown()
        last = [d async for d in running][-1]
        assert last.finished and {s.finish_reason for s in last.sequences} == {"abort"}
        with pytest.raises(EngineDeadError):
            await client.add_request("abc", params)

    asyncio.run(run())
    client.shutdown()
    assert not client._thread.is_alive() and not client.is_alive
    assert engine.num_free_kv_blocks() == engine.num_usable_kv_blocks()


def test_a_failing_engine_fails_its_requests_instead_of_hanging(tiny_llama):
    engine = LLMEngine(EngineConfig(str(tiny_llama), max_model_len=64, async_scheduling=False))
    client = AsyncEngineClient(engine)

    def broken_step():  # as a runner worker's failure: its traceback in the message
        trace = 'Traceback (most recent call last):\n  File "runner.py", line 1, in step\n'
        raise RunnerFailed(f"model runner worker failed:\n{trace}RuntimeError: boom")

    async def run() -> None:
        client.start()
        engine.step = broken_step
        stream = await client.add_request("abc", SamplingParams(max_tokens=5))
        with pytest.raises(EngineDeadError, match="boom") as failed:
            await anext(stream)
        assert "Traceback" not in str(failed.value) and "runner.py" not in str(failed.value)
        assert not client.is_alive
        with pytest.raises(EngineDeadError, match="boom"):
            await client.add_request("abc", SamplingParams(max_tokens=5))

    asyncio.run(asyncio.wait_for(run(), timeout=30))
    client.shutdown()
