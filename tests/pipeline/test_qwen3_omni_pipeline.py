"""The Qwen3-Omni pipeline (thinker -> talker -> code2wav, the packaged demo-omni deploy) on
the tiny float64 checkpoint: what scheduling and streaming may and may not change.

- Sync and async scheduling give the same text and bit-identical audio, with a sampled
  (seeded) talker: every draw is keyed by (request seed, output position), never by
  batch row or step timing.
- Streamed audio, concatenated, equals the whole-payload audio within 1e-5. The chunks
  are decoded with 32 frames of left context; the tiny code2wav's receptive field is
  longer (an 8-frame attention window per transformer layer, then the convolutions'
  context), so a seam sample can differ from the whole decode by what the frames
  beyond the context still contribute (measured ~1e-7 here). Chunk boundaries and
  lengths are exact: each chunk returns exactly the samples the whole decode has there.
- 50 concurrent requests, text-only and text+audio mixed, all complete, and every
  stage's counters and shared-memory segments are back to zero afterwards.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os

import numpy as np
import pytest
import torch

from omnistage import SamplingParams
from omnistage.pipeline.deploy import load_deploy, packaged_deploy_path
from omnistage.pipeline.omni import AsyncOmni, Omni
from omnistage.testing.tiny_qwen3_omni import make_tiny_qwen3_omni

PROMPTS = [
    "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhy?<|im_end|>\n"
    "<|im_start|>assistant\n",
    "<|im_start|>user\nSay a long sentence about cats<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_qwen3_omni(tmp_path_factory.mktemp("qwen3-omni-pipe"), dtype=torch.float64)


def _deploy(ckpt, async_scheduling: bool = True, stream: bool = True):
    spec = load_deploy(packaged_deploy_path("demo-omni")).with_model(str(ckpt))
    spec = spec.with_engine_args({"dtype": "float64", "async_scheduling": async_scheduling})
    if not stream:
        edges = tuple(
            dataclasses.replace(e, transfer="payload") if e.dst == "code2wav" else e
            for e in spec.edges
        )
        spec = dataclasses.replace(spec, edges=edges)
    return spec


PARAMS = {
    "thinker": SamplingParams(temperature=0.8, seed=100, max_tokens=12),
    "talker": SamplingParams(
        temperature=0.9, top_k=50, repetition_penalty=1.05, seed=7, max_tokens=48
    ),
}


def _run(spec) -> list:
    """The prompts as one batch (their steps interleave in every stage)."""
    with Omni(spec, in_process=True) as omni:
        results = omni.generate(PROMPTS, PARAMS)
    for out in results:
        assert out.error is None, out.error
        assert out.audio is not None and out.audio.size > 0
    return results


def test_sync_and_async_scheduling_give_identical_text_and_audio(ckpt):
    sync = _run(_deploy(ckpt, async_scheduling=False))
    asyn = _run(_deploy(ckpt, async_scheduling=True))
    for a, b in zip(sync, asyn, strict=True):
        assert a.token_ids == b.token_ids
        assert np.array_equal(a.audio, b.audio)


def test_streamed_audio_equals_whole_payload_audio(ckpt):
    streamed = _run(_deploy(ckpt, stream=True))
    whole = _run(_deploy(ckpt, stream=False))
    for s, w in zip(streamed, whole, strict=True):
        assert s.token_ids == w.token_ids
        assert s.audio.shape == w.audio.shape
        np.testing.assert_allclose(s.audio, w.audio, rtol=0, atol=1e-5)
    # The longest reply is streamed in several chunks (first 4 frames, then 16).
    assert max(s.audio.size for s in streamed) > 64 * 20


def test_fifty_concurrent_mixed_requests_complete_and_leave_nothing(ckpt):
    async def run() -> list:
        with AsyncOmni(_deploy(ckpt)) as omni:

            async def one(i: int):
                modalities = ["text"] if i % 3 == 0 else None
                last = None
                chunks = 0
                async for out in omni.generate(PROMPTS[i % 3], PARAMS, modalities):
                    chunks += out.new_data is not None and out.new_data.numel() > 0
                    last = out
                return i, last, chunks

            results = await asyncio.gather(*(one(i) for i in range(50)))
            counters = omni.stage_counters()
            return results, counters, omni.orchestrator.namespace

    results, counters, namespace = asyncio.run(run())
    for i, out, chunks in results:
        assert out.finished and out.error is None, out.error
        if i % 3 == 0:
            assert out.audio is None and set(out.outputs) == {"thinker"}
        else:
            assert out.audio is not None and chunks >= 2  # streamed: several audio chunks
    for stage, values in counters.items():
        assert all(v == 0 for v in values.values()), (stage, values)
    leftover = [f for f in os.listdir("/dev/shm") if namespace in f]
    assert leftover == []
