"""Stream-conditioned requests: positions after the prompt wait for one conditioning row
each (added to their input embeddings), streamed in while the request generates."""

from __future__ import annotations

import pytest
import torch

from omnistage import SamplingParams
from omnistage.config import EngineConfig
from omnistage.engine.llm_engine import LLMEngine

PARAMS = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
PROMPT = list(range(40, 70))


def make_engine(path, **kw) -> LLMEngine:
    kw.setdefault("async_scheduling", False)
    return LLMEngine(EngineConfig(model=str(path), dtype="float64", **kw))


def rows(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 64, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def run(engine: LLMEngine, feed: list[tuple[int, int]], total: torch.Tensor) -> list[int]:
    """Generate, feeding `total`'s rows in pieces: (after this many steps, this many rows)."""
    engine.add_tokenized_request("r", None, PROMPT, PARAMS, stream_conditioning=True)
    sent, step, tokens = 0, 0, None
    pieces = list(feed)
    while engine.has_unfinished_requests():
        while pieces and pieces[0][0] <= step:
            _, n = pieces.pop(0)
            last = not pieces
            engine.add_conditioning("r", total[sent : sent + n], finished=last)
            sent += n
        for out in engine.step():
            if out.finished:
                tokens = out.outputs[0].token_ids
        step += 1
        assert step < 500, "stalled"
    return tokens


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_output_does_not_depend_on_when_rows_arrive(tiny_llama_f64, async_scheduling):
    total = rows(16)
    args = {"async_scheduling": async_scheduling, "executor_backend": "thread"}
    all_at_once = run(make_engine(tiny_llama_f64, **args), [(0, 16)], total)
    trickled = run(make_engine(tiny_llama_f64, **args), [(0, 1), (3, 2), (9, 5), (20, 8)], total)
    late = run(make_engine(tiny_llama_f64, **args), [(6, 4), (30, 12)], total)
    assert all_at_once == trickled == late
    assert len(all_at_once) == 24


def test_rows_change_the_output_and_zero_rows_do_not(tiny_llama_f64):
    plain_engine = make_engine(tiny_llama_f64)
    plain_engine.add_tokenized_request("p", None, PROMPT, PARAMS)
    plain = None
    while plain_engine.has_unfinished_requests():
        for out in plain_engine.step():
            if out.finished:
                plain = out.outputs[0].token_ids
    zeros = run(make_engine(tiny_llama_f64), [(0, 10)], torch.zeros(10, 64, dtype=torch.float64))
    assert zeros == plain
    assert run(make_engine(tiny_llama_f64), [(0, 10)], rows(10, seed=3) * 5) != plain


def test_a_request_waiting_for_rows_is_not_scheduled(tiny_llama_f64):
    engine = make_engine(tiny_llama_f64)
    engine.add_tokenized_request("r", None, PROMPT, PARAMS, stream_conditioning=True)
    for _ in range(5):
        engine.step()
    (out,) = [o for o in [engine._tracked["r"].output]]
    assert len(out.outputs[0].token_ids) == 1  # the prompt's token; then it waits for a row
    engine.add_conditioning("r", rows(2), finished=False)
    for _ in range(5):
        engine.step()
    assert len(engine._tracked["r"].output.outputs[0].token_ids) == 3
    with pytest.raises(ValueError, match=r"conditioning: expected \[rows, 64\]"):
        engine.add_conditioning("r", torch.zeros(2, 7), finished=False)
    engine.abort_request("r")
    assert engine.num_free_kv_blocks() == engine.num_usable_kv_blocks()


def _with_fill(
    engine: LLMEngine, total: torch.Tensor, fill: torch.Tensor | None, late: bool = False
) -> list[int]:
    """Feed `total` at once, then end the stream with `fill` for every later position: at
    once, or (`late`) a few steps later, while the request runs."""
    engine.add_tokenized_request("r", None, PROMPT, PARAMS, stream_conditioning=True)
    engine.add_conditioning("r", total, finished=not late, fill=fill)
    tokens, step = None, 0
    while engine.has_unfinished_requests():
        if late and step == 3:
            engine.add_conditioning("r", total[:0], finished=True, fill=fill)
        for out in engine.step():
            if out.finished:
                tokens = out.outputs[0].token_ids
        step += 1
    return tokens


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_fill_row_conditions_every_later_position(tiny_llama_f64, async_scheduling):
    """A fill row equals sending that row for every position after the last one, whether it
    comes with the rows or while the request runs, and it is sent again when a preempted
    request is recomputed (a tiny KV pool preempts)."""
    total, fill = rows(6), rows(1, seed=9)[0] * 3
    args = {"async_scheduling": async_scheduling, "executor_backend": "thread"}
    explicit = torch.cat([total, fill.expand(PARAMS.max_tokens, -1)])
    spelled_out = run(make_engine(tiny_llama_f64, **args), [(0, len(explicit))], explicit)
    filled = _with_fill(make_engine(tiny_llama_f64, **args), total, fill)
    assert filled == spelled_out
    assert _with_fill(make_engine(tiny_llama_f64, **args), total, fill, late=True) == filled
    assert _with_fill(make_engine(tiny_llama_f64, **args), total, None) != filled
    crowded = make_engine(tiny_llama_f64, num_kv_blocks=20, block_size=4, max_model_len=64, **args)
    crowded.add_tokenized_request("other", None, list(range(3, 30)), PARAMS)
    assert _with_fill(crowded, total, fill) == filled
    assert crowded.core.scheduler.num_preemptions > 0


def test_the_feed_sends_rows_once_and_the_fill_row_once():
    """`ConditioningFeed` alone: a running request's new rows go out once; the fill row goes
    out once, with the step after the stream ends (and again, once, to a runner that
    relearns the request after a preemption)."""
    from omnistage.core.conditioning import ConditioningFeed
    from omnistage.core.request import Request
    from omnistage.core.tensor_blob import blob_to_tensor

    feed = ConditioningFeed()
    request = Request(
        "r", [1, 2], SamplingParams(max_tokens=8), eos_token_id=None, max_tokens=8, sample_seed=0
    )
    request.stream_conditioning = True

    def collect() -> tuple[dict, dict]:
        rows, fill = {}, {}
        feed.collect(request, rows, fill)
        return rows, fill

    feed.add(request, torch.ones(2, 3), finished=False, fill=None)
    feed.add(request, torch.zeros(0, 3), finished=False, fill=None)  # nothing new
    rows, fill = collect()
    assert blob_to_tensor(rows["r"]).tolist() == [[1.0] * 3] * 2 and fill == {}
    assert collect() == ({}, {})
    feed.add(request, torch.full((1, 3), 2.0), finished=True, fill=torch.full((3,), 7.0))
    rows, fill = collect()
    assert blob_to_tensor(rows["r"]).tolist() == [[2.0] * 3]
    assert blob_to_tensor(fill["r"]).tolist() == [7.0] * 3
    assert collect() == ({}, {})  # the fill row went out once
    again_rows, again_fill = feed.for_new(request)  # a runner that relearns the request
    assert blob_to_tensor(again_rows).shape == (3, 3)
    assert blob_to_tensor(again_fill).tolist() == [7.0] * 3
    assert collect() == ({}, {})


def test_a_request_that_ends_before_its_fill_row_is_sent_leaves_nothing(tiny_llama_f64):
    """The stream ended with a fill row, then the request was aborted before any step sent
    it: the scheduler's conditioning feed forgets it."""
    engine = make_engine(tiny_llama_f64, executor_backend="thread")
    try:
        conditioning = engine.core.scheduler.conditioning
        engine.add_tokenized_request("r", None, PROMPT, PARAMS, stream_conditioning=True)
        engine.add_conditioning("r", rows(2), finished=True, fill=rows(1)[0])
        assert conditioning.num_unsent_fills == 1
        engine.abort_request("r")
        assert conditioning.num_unsent_fills == 0
    finally:
        engine.shutdown()
