"""MiMo-Audio with streaming code2wav end to end (the packaged demo-mimo-audio-stream
deploy: lm -> code2wav_stream) on the tiny checkpoint.

- Parity: greedy (float32), each prompt of `fixtures/mimo_audio/reference.json` in chunks
  of 4 steps gives the audio of the reference tokenizer's `streaming_decode` of the
  reference LM's codes in those chunks (`streaming.json`, `greedy/i`) within 1e-5.
- Sync and async scheduling give identical text tokens, payload bytes and audio bytes
  (float64, sampled, seeded, a batch); each request of the batch equals it alone; each
  stream ends with exactly one `meta.finished` payload, its last.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from omnistage import SamplingParams
from omnistage.core.payload import unpack_payload
from omnistage.testing.tiny_deploys import tiny_speech_deploy
from tests.pipeline.test_mimo_audio_pipeline import PROMPTS, run

FIXTURES = Path(__file__).parents[1] / "fixtures" / "mimo_audio"
DEPLOY = "demo-mimo-audio-stream"
SAMPLED = SamplingParams(temperature=0.9, top_p=0.95, seed=7, max_tokens=40)


@pytest.fixture(scope="module")
def streaming() -> dict:
    return json.loads((FIXTURES / "streaming.json").read_text())


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, streaming) -> Path:
    from omnistage.families.mimo_audio.tiny import make_tiny_mimo_audio

    return make_tiny_mimo_audio(tmp_path_factory.mktemp("mimo") / "tiny", streaming["seed"])


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("OMNISTAGE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _chunked(spec, first: int, chunk: int):
    edges = tuple(
        dataclasses.replace(e, first_chunk_size=first, chunk_size=chunk) for e in spec.edges
    )
    return dataclasses.replace(spec, edges=edges)


def test_greedy_streamed_audio_equals_the_reference_streaming_decode(checkpoint, streaming):
    reference = json.loads((FIXTURES / "reference.json").read_text())
    cases = [c for c in streaming["cases"] if c["name"].startswith("greedy/")]
    assert {(c["first"], c["chunk"]) for c in cases} == {(4, 4)}
    spec = _chunked(tiny_speech_deploy(DEPLOY, checkpoint, dtype="float32"), 4, 4)
    greedy = SamplingParams(temperature=0.0, max_tokens=reference["max_new_tokens"])
    prompts = [{"prompt_token_ids": c["prompt_token_ids"]} for c in reference["cases"]]
    outputs, received = run(spec, prompts, greedy)
    for i, (case, out) in enumerate(zip(cases, outputs, strict=True)):
        assert out.token_ids == reference["cases"][i]["tokens"]
        assert [k[1] for k in sorted(received) if k[0] == i] == list(range(len(case["chunks"])))
        expected = np.concatenate([np.array(a or [], dtype=np.float64) for a in case["audio"]])
        assert out.audio.shape == expected.shape and expected.size > 0
        np.testing.assert_allclose(out.audio, expected, rtol=0, atol=1e-5)


def _finished_once(received, n: int) -> None:
    for i in range(n):
        mine = sorted(c for p, c in received if p == i)
        assert len(mine) > 2
        finished = [unpack_payload(received[i, c])["meta.finished"] for c in mine]
        assert finished == [False] * (len(mine) - 1) + [True]


def test_sync_equals_async_and_batched_equals_alone(checkpoint):
    spec = _chunked(tiny_speech_deploy(DEPLOY, checkpoint), 16, 8)
    batched = run(spec, PROMPTS, SAMPLED)
    sync = run(
        _chunked(tiny_speech_deploy(DEPLOY, checkpoint, async_scheduling=False), 16, 8),
        PROMPTS,
        SAMPLED,
    )
    for a, b in zip(sync[0], batched[0], strict=True):
        assert a.token_ids == b.token_ids
        assert a.audio.size > 0 and a.audio.tobytes() == b.audio.tobytes()
    assert sync[1] == batched[1]
    _finished_once(batched[1], len(PROMPTS))
    (alone,), _ = run(spec, PROMPTS[1:2], SAMPLED)
    assert alone.token_ids == batched[0][1].token_ids
    assert alone.audio.tobytes() == batched[0][1].audio.tobytes()
