"""The model runner's sample observers (worker/sample_observer.py): the public seam through
which tests see each step's raw logits and sampled ids.

- an event per sampling step, positions in batch order, each named by its request;
- the logits are the model's, before logits processors change them in place;
- removal (and the context manager) stops the calls; no observer, no event;
- under speculation a verifying request has one position per verified token;
- with the thread executor (async scheduling) the runner is observed in-process, and its
  logits equal the sync runner's.
"""

from __future__ import annotations

import torch

from omnistage import SamplingParams
from omnistage.config import EngineConfig
from omnistage.engine.llm_engine import LLMEngine
from omnistage.worker.sample_observer import SampleEvent

PROMPTS = {"a": [5, 17, 33, 9, 100], "b": list(range(40, 61))}
STEPS = 4


def make_engine(path, **kw) -> LLMEngine:
    kw.setdefault("async_scheduling", False)
    return LLMEngine(EngineConfig(model=str(path), dtype="float64", **kw))


def run(engine: LLMEngine, params: SamplingParams) -> dict[str, list[int]]:
    for req_id, ids in PROMPTS.items():
        engine.add_tokenized_request(req_id, None, ids, params)
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
    return done


def by_request(events: list[SampleEvent]) -> dict[str, tuple[list[torch.Tensor], list[int]]]:
    """Per request: the logits and the sampled id of each of its sampled positions."""
    seen: dict[str, tuple[list[torch.Tensor], list[int]]] = {}
    for event in events:
        for req_id, logits, token in zip(
            event.req_ids, event.logits, event.token_ids.tolist(), strict=True
        ):
            seen.setdefault(req_id, ([], []))[0].append(logits)
            seen[req_id][1].append(token)
    return seen


GREEDY = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True)


def test_one_event_per_sampling_step_in_batch_order(tiny_llama_f64):
    engine = make_engine(tiny_llama_f64)
    events: list[SampleEvent] = []
    engine.core.executor.runner.add_sample_observer(events.append)
    done = run(engine, GREEDY)
    assert len(events) == STEPS  # both prompts in one step, then one decode step each
    for event in events:
        assert event.req_ids == ["a", "b"]
        assert event.logits.shape[0] == len(event.token_ids) == 2 and event.codes is None
    for req_id, (logits, tokens) in by_request(events).items():
        assert tokens == done[req_id]
        assert [int(row.argmax()) for row in logits] == tokens  # greedy: the raw argmax


def test_logits_are_raw_before_the_processors(tiny_llama_f64):
    plain, biased = [], []
    engine = make_engine(tiny_llama_f64)
    runner = engine.core.executor.runner
    with runner.observing_samples(plain.append):
        run(engine, GREEDY)
    bias = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True, logit_bias={7: 100.0})
    with runner.observing_samples(biased.append):
        done = run(engine, bias)
    assert done == {"a": [7] * STEPS, "b": [7] * STEPS}
    # The first step's logits come from the same prompts: equal, the bias not in them.
    assert torch.equal(biased[0].logits, plain[0].logits)
    assert biased[0].token_ids.tolist() == [7, 7] != plain[0].token_ids.tolist()


def test_removed_observers_are_not_called(tiny_llama_f64):
    engine = make_engine(tiny_llama_f64)
    runner = engine.core.executor.runner
    kept, removed = [], []
    runner.add_sample_observer(kept.append)
    observer = runner.add_sample_observer(removed.append)
    runner.remove_sample_observer(observer)
    runner.remove_sample_observer(observer)  # a second removal is a no-op
    run(engine, GREEDY)
    assert len(kept) == STEPS and removed == []
    runner.remove_sample_observer(kept.append)
    run(engine, GREEDY)
    assert len(kept) == STEPS


def test_verifying_requests_have_a_position_per_verified_token(tiny_llama_f64):
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
    engine = make_engine(tiny_llama_f64, speculative_config=spec)
    events: list[SampleEvent] = []
    engine.core.executor.runner.add_sample_observer(events.append)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    done = run(engine, params)
    widths = []
    for event in events:
        assert event.logits.shape[0] == len(event.req_ids) == len(event.token_ids)
        for req_id in set(event.req_ids):  # a request's positions are consecutive
            at = [i for i, r in enumerate(event.req_ids) if r == req_id]
            assert at == list(range(at[0], at[0] + len(at)))
            widths.append(len(at))
            # The first position samples after the newest real token: the next output.
            assert event.token_ids[at[0]] in done[req_id]
    assert max(widths) > 1  # drafts were verified
    assert sum(widths) >= sum(len(t) for t in done.values())


def test_thread_executor_is_observed_in_process_with_the_sync_logits(tiny_llama_f64):
    sync = make_engine(tiny_llama_f64)
    sync_events: list[SampleEvent] = []
    sync.core.executor.runner.add_sample_observer(sync_events.append)
    expected = run(sync, GREEDY)
    engine = make_engine(tiny_llama_f64, async_scheduling=True, executor_backend="thread")
    events: list[SampleEvent] = []
    try:
        engine.core.executor.runner.add_sample_observer(events.append)
        assert run(engine, GREEDY) == expected
    finally:
        engine.shutdown()
    ours, theirs = by_request(events), by_request(sync_events)
    for req_id in PROMPTS:
        assert ours[req_id][1] == theirs[req_id][1]
        torch.testing.assert_close(torch.stack(ours[req_id][0]), torch.stack(theirs[req_id][0]))
