"""The async scheduler's placeholders, step by step: a step that samples for a request adds
one (and one per draft slot); its result takes them back; a request never gets a step past
max_tokens counting the tokens in flight; and a prompt chunk that samples nothing adds none."""

from __future__ import annotations

from omnistage.config import EngineConfig
from omnistage.core.async_scheduler import AsyncScheduler
from omnistage.core.kv_cache_manager import KVCacheManager
from omnistage.core.request import Request
from omnistage.core.sched_output import ModelRunnerOutput
from omnistage.sampling_params import SamplingParams


def _scheduler(budget=32, spec=None) -> AsyncScheduler:
    config = EngineConfig(
        model="unused",
        max_model_len=64,
        max_num_batched_tokens=budget,
        max_num_seqs=8,
        block_size=4,
        speculative_config=spec,
    )
    return AsyncScheduler(config, KVCacheManager(64, 4, 64, True))


def _request(rid: str, n_prompt: int, max_tokens: int) -> Request:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return Request(rid, list(range(1, n_prompt + 1)), params, 99, max_tokens, sample_seed=0)


def _result(so, sampled: dict[str, list[int]]) -> ModelRunnerOutput:
    ids = list(so.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=ids, sampled_token_ids=[sampled.get(r, []) for r in ids], logprobs=[None] * len(ids)
    )


def test_no_step_past_max_tokens_counting_the_tokens_in_flight():
    s = _scheduler()
    s.add_request(_request("a", 3, max_tokens=2))
    a = s.requests["a"]
    first = s.schedule()
    assert first.num_scheduled_tokens == {"a": 3} and a.num_output_placeholders == 1
    second = s.schedule()
    assert second.num_scheduled_tokens == {"a": 1} and a.num_output_placeholders == 2
    third = s.schedule()  # two tokens in flight, two allowed: nothing for a
    assert third.num_scheduled_tokens == {} and a.num_output_placeholders == 2
    s.update_from_output(first, _result(first, {"a": [7]}))
    assert a.num_output_placeholders == 1 and a.output_token_ids == [7]
    assert s.schedule().num_scheduled_tokens == {}  # 1 out + 1 in flight = 2
    outs = s.update_from_output(second, _result(second, {"a": [8]}))
    assert a.num_output_placeholders == 0 and outs[0].finish_reason == "length"


def test_a_prompt_chunk_that_samples_nothing_adds_no_placeholder():
    s = _scheduler(budget=4)
    s.add_request(_request("a", 6, max_tokens=3))
    a = s.requests["a"]
    chunk = s.schedule()
    assert chunk.num_scheduled_tokens == {"a": 4} and a.num_output_placeholders == 0
    last = s.schedule()
    assert last.num_scheduled_tokens == {"a": 2} and a.num_output_placeholders == 1
    decode = s.schedule()
    assert decode.num_scheduled_tokens == {"a": 1} and a.num_output_placeholders == 2
    s.update_from_output(chunk, _result(chunk, {}))
    assert a.num_output_placeholders == 2
    s.update_from_output(last, _result(last, {"a": [5]}))
    assert a.num_output_placeholders == 1


def test_draft_slots_add_placeholders_that_their_result_takes_back():
    s = _scheduler(spec={"method": "ngram", "num_speculative_tokens": 2})
    s.add_request(_request("a", 3, max_tokens=10))
    a = s.requests["a"]
    first, second = s.schedule(), s.schedule()
    assert second.scheduled_spec_tokens == {"a": 2}
    assert a.num_output_placeholders == 1 + (1 + 2)
    s.update_from_output(first, _result(first, {"a": [7]}))
    assert a.num_output_placeholders == 3
    s.update_from_output(second, _result(second, {"a": [8, 9]}))  # one draft accepted
    assert a.num_output_placeholders == 0 and a.output_token_ids == [7, 8, 9]
    assert a.num_computed_tokens == 3 + 3 - 1  # the rejected draft's position is computed again
