"""Ming-Omni's talker alone (talker -> vocoder, the packaged demo-ming-omni-tts deploy: the
talker renders its own prompt from the text) on the tiny float64 checkpoint: what
scheduling and batching may and may not change.

- Sync and async scheduling give the same talker speech ids and audio bytes, with seeded
  top-k sampling, and the vocoder receives byte-identical payloads (`ids.output`,
  `meta.finished` once);
- each request alone gives what it gives in a batch;
- a streaming client sees one finished output per request whose audio is the whole run's
  (one piece: the vocoder is not causal);
- a voice the checkpoint lacks, `instructions`, another `language` and an empty text are
  ValueErrors naming the field; nothing is left held.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from omnistage import SamplingParams
from omnistage.core.payload import unpack_payload
from omnistage.families.ming_omni.tiny import make_tiny_ming_omni
from omnistage.pipeline.omni import AsyncOmni, Omni
from omnistage.testing.tiny_deploys import tiny_speech_deploy
from tests.pipeline.pipeline_runs import run_recorded

TEXTS = ["Hello there", "Why?", "Say a long sentence about cats, please."]
PARAMS = {
    "talker": SamplingParams(temperature=1.0, top_k=20, seed=7, max_tokens=24),
    "vocoder": SamplingParams(seed=5),
}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_ming_omni(tmp_path_factory.mktemp("ming-tts"), dtype=torch.float64)


def _deploy(ckpt, async_scheduling: bool):
    return tiny_speech_deploy("demo-ming-omni-tts", ckpt, async_scheduling=async_scheduling)


def _run(spec, texts: list[str]) -> tuple[list, dict]:
    """(per text: talker ids, audio bytes), and what the vocoder received, packed."""
    outputs, received = run_recorded(spec, texts, PARAMS)
    return [(o.outputs["talker"].token_ids, o.audio.tobytes()) for o in outputs], received


@pytest.fixture(scope="module")
def sync_run(ckpt):
    return _run(_deploy(ckpt, False), TEXTS)


def test_sync_equals_async_and_payloads_are_identical(ckpt, sync_run):
    ids, received = sync_run
    assert all(0 < len(talker) <= 24 and len(audio) > 0 for talker, audio in ids)
    assert len({tuple(t) for t, _ in ids}) == len(TEXTS)  # the text matters
    async_ids, async_received = _run(_deploy(ckpt, True), TEXTS)
    assert ids == async_ids
    assert received.keys() == async_received.keys() and len(received) == len(TEXTS)
    for key, data in received.items():
        assert async_received[key] == data
        assert unpack_payload(data)["meta.finished"] is True


def test_alone_equals_batched(ckpt, sync_run):
    ids, _ = sync_run
    alone, _ = _run(_deploy(ckpt, False), [TEXTS[2]])
    assert alone == [ids[2]]


def test_streamed_audio_is_the_whole_audio(ckpt, sync_run):
    async def stream() -> list[tuple[int, bytes]]:
        with AsyncOmni(_deploy(ckpt, True), in_process=True) as omni:

            async def one(i: int) -> tuple[int, bytes]:
                finished, audio = 0, []
                async for out in omni.generate(TEXTS[i], PARAMS, request_id=f"s{i}"):
                    assert out.error is None, out.error
                    finished += out.finished
                    if out.stage == "vocoder" and out.new_data is not None:
                        audio.append(out.new_data.to(torch.float32).numpy().tobytes())
                return finished, b"".join(audio)

            return await asyncio.gather(*(one(i) for i in range(len(TEXTS))))

    assert asyncio.run(stream()) == [(1, audio) for _, audio in sync_run[0]]


def test_bad_input_is_a_value_error_naming_the_field(ckpt):
    with Omni(_deploy(ckpt, False), in_process=True) as omni:
        with pytest.raises(ValueError, match="voice"):
            omni.generate(TEXTS[:1], PARAMS, voice="nobody")
        bad = {"instructions": "whisper", "language": "French"}
        for field, value in bad.items():
            (out,) = omni.generate(TEXTS[:1], PARAMS, **{field: value})
            assert out.error is not None and field in out.error
        (out,) = omni.generate(["   "], PARAMS)
        assert out.error is not None and "input" in out.error
        (ok,) = omni.generate(TEXTS[:1], PARAMS, voice="luna")
        counters = omni.stage_counters()
    assert ok.error is None
    assert all(v == 0 for c in counters.values() for v in c.values()), counters
