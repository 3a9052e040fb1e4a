"""MiMo-Audio's streaming code2wav (`streaming.py`, the `code2wav_stream` part) in its
generation stage, on the tiny checkpoint.

- Parity: each chunk's audio equals the reference tokenizer's `streaming_decode` of that
  chunk (`fixtures/mimo_audio/streaming.json`, `make_streaming_fixture.py`) within 1e-5
  (float32), for the greedy LM cases in chunks of 4 steps and for random step sequences
  in the `mimo-audio-stream` deploy's chunks (16, then 25 steps: the window slides past
  250 codes; whole chunks with an empty last one).
- The first chunk of 16 steps with more than 40 codes brings audio at once.
- float64: chunks delivered one at a time (stepped after each, each request alone) or
  all at once (late, several requests in one batch) give the same bytes; all-zero rows
  anywhere change nothing.
- A chunk whose left context holds under 250 codes and misses the request's start is a
  ValueError naming left_context.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from omnistage.core.tensor_blob import blob_to_tensor
from omnistage.families.mimo_audio.streaming import MiMoAudioStreamingCode2Wav, window_bounds
from omnistage.families.mimo_audio.tiny import make_tiny_mimo_audio
from omnistage.models.generation import GenerationItem
from omnistage.pipeline.deploy import load_deploy, packaged_deploy_path
from omnistage.pipeline.generation_stage import GenerationStageCore
from omnistage.pipeline.messages import SubmitRequest

FIXTURE = Path(__file__).parents[1] / "fixtures" / "mimo_audio" / "streaming.json"
EDGE = "lm->code2wav"


@pytest.fixture(scope="module")
def reference() -> dict:
    return json.loads(FIXTURE.read_text())


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, reference) -> Path:
    return make_tiny_mimo_audio(tmp_path_factory.mktemp("mimo") / "tiny", reference["seed"])


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("OMNISTAGE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def core(checkpoint: Path, dtype: str, max_num_seqs: int = 16) -> GenerationStageCore:
    spec = load_deploy(packaged_deploy_path("demo-mimo-audio-stream")).with_model(str(checkpoint))
    spec = spec.with_engine_args({"dtype": dtype, "max_num_seqs": max_num_seqs})
    stage = GenerationStageCore(spec.stage("code2wav"), spec, namespace="tmimostream")
    assert isinstance(stage.model, MiMoAudioStreamingCode2Wav)
    return stage


def chunks_of(case: dict) -> list[torch.Tensor]:
    rows = torch.tensor(case["rows"])
    return [rows[a:b] for a, b in (c["steps"] for c in case["chunks"])]


def deliver(stage: GenerationStageCore, rid: str, i: int, rows: torch.Tensor, last: bool):
    msg = SimpleNamespace(request_id=rid, edge=EDGE, chunk_index=i, last=last)
    assert stage.on_input(msg, {"codes.output": rows}) == []


def drain(stage: GenerationStageCore) -> dict[str, list[torch.Tensor]]:
    out: dict[str, list[torch.Tensor]] = {}
    while stage.has_work():
        for event in stage.step():
            out.setdefault(event.request_id, []).append(blob_to_tensor(event.data))
    return out


def early(stage: GenerationStageCore, streams: dict[str, list[torch.Tensor]]) -> dict:
    """Each request alone, stepped after each chunk: its chunks' audio in order."""
    got = {}
    for rid, chunks in streams.items():
        assert stage.handle(SubmitRequest(request_id=rid, wait_for=[EDGE])) == []
        got[rid] = []
        for i, rows in enumerate(chunks):
            deliver(stage, rid, i, rows, i == len(chunks) - 1)
            got[rid] += drain(stage).get(rid, [])
    return got


def late(stage: GenerationStageCore, streams: dict[str, list[torch.Tensor]]) -> dict:
    """Every chunk of every request delivered (interleaved) before the stage steps."""
    for rid in streams:
        assert stage.handle(SubmitRequest(request_id=rid, wait_for=[EDGE])) == []
    for i in range(max(len(c) for c in streams.values())):
        for rid, chunks in streams.items():
            if i < len(chunks):
                deliver(stage, rid, i, chunks[i], i == len(chunks) - 1)
    return drain(stage)


def test_each_chunk_equals_the_reference_streaming_decode(checkpoint, reference):
    stage = core(checkpoint, "float32")
    cases = {c["name"]: c for c in reference["cases"]}
    got = early(stage, {name: chunks_of(c) for name, c in cases.items()})
    for name, case in cases.items():
        assert len(got[name]) == len(case["audio"]), name
        for mine, ref in zip(got[name], case["audio"], strict=True):
            np.testing.assert_allclose(mine.numpy(), np.array(ref or []), rtol=0, atol=1e-5)
    # 16 steps with more than 40 codes: audio with the first chunk, not at the end.
    assert got["long"][0].numel() > 0 and len(got["long"]) > 2
    # Not the whole decode's audio (GroupNorm over each window): the windows are seen.
    model = stage.model
    whole = model.decode(model.frames(torch.tensor(cases["long"]["rows"])))
    streamed = torch.cat(got["long"])
    assert streamed.shape == whole.shape and not torch.allclose(streamed, whole, atol=1e-3)
    assert stage.counters()["stream_entries"] == 0 and not stage.has_work()


def test_early_equals_late_alone_equals_batched_in_float64(checkpoint, reference):
    streams = {c["name"]: chunks_of(c) for c in reference["cases"]}
    alone = early(core(checkpoint, "float64"), streams)
    together = late(core(checkpoint, "float64", max_num_seqs=3), streams)
    for rid in streams:
        assert alone[rid][-1].numel() > 0
        assert [a.numpy().tobytes() for a in alone[rid]] == [
            t.numpy().tobytes() for t in together[rid]
        ]


def test_all_zero_rows_produce_no_audio(checkpoint, reference):
    case = next(c for c in reference["cases"] if c["name"] == "long")
    chunks = chunks_of(case)
    zeros = torch.zeros(3, chunks[0].shape[1], dtype=chunks[0].dtype)
    padded = [zeros] + [torch.cat([c[:5], zeros, c[5:], zeros]) for c in chunks]
    stage = core(checkpoint, "float64")
    got = early(stage, {"plain": chunks, "padded": padded})
    assert got["padded"][0].numel() == 0  # a first chunk of zero rows: no audio
    assert [t.numpy().tobytes() for t in got["padded"][1:]] == [
        t.numpy().tobytes() for t in got["plain"]
    ]
    only = early(stage, {"silent": [zeros, zeros]})["silent"]
    assert [t.numel() for t in only] == [0, 0]


def test_window_bounds():
    assert window_bounds(0, 40, False) == (0, 0, 0)  # at most 40 codes: nothing yet
    assert window_bounds(0, 64, False) == (0, 0, 24)
    assert window_bounds(24 + 40, 100, False) == (64, 24, 124)
    assert window_bounds(1000, 100, False) == (250, 210, 310)
    assert window_bounds(1000, 0, False) == (250, 210, 210)
    assert window_bounds(30, 0, True) == (30, 0, 30)
    assert window_bounds(300, 7, True) == (250, 210, 257)


def test_a_left_context_that_misses_the_start_is_named(checkpoint, reference):
    model = core(checkpoint, "float32").model
    rows = torch.tensor(reference["cases"][-2]["rows"])  # "long"
    model.check_item(GenerationItem(rows[:100], context_len=60, offset=0, last=False))
    model.check_item(GenerationItem(rows[40:200], context_len=90, offset=40, last=False))
    with pytest.raises(ValueError, match=r"step 110 has \d+ codes of left context.*left_context"):
        model.check_item(GenerationItem(rows[100:140], context_len=10, offset=100, last=False))
