"""The scheduler's side of speculative decoding, without a model: how many draft slots a
decoding request gets (what the runner proposed, synchronously; the most, asynchronously),
capped by max_tokens, max_model_len and the step's budget; and what a verified step gives
back (rejected drafts' positions, draft and acceptance counts)."""

from __future__ import annotations

import torch

from omnistage.config import EngineConfig
from omnistage.core.async_scheduler import AsyncScheduler
from omnistage.core.kv_cache_manager import KVCacheManager
from omnistage.core.request import Request
from omnistage.core.sched_output import ModelRunnerOutput
from omnistage.core.scheduler import Scheduler
from omnistage.sampling_params import SamplingParams


def _scheduler(cls=Scheduler, k=3, budget=32, max_model_len=64, method="ngram") -> Scheduler:
    config = EngineConfig(
        model="unused",
        max_model_len=max_model_len,
        max_num_batched_tokens=budget,
        max_num_seqs=8,
        block_size=4,
        speculative_config={"method": method, "num_speculative_tokens": k},
    )
    return cls(config, KVCacheManager(64, 4, max_model_len, True))


def _request(rid: str, n_prompt: int, max_tokens: int = 20) -> Request:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return Request(rid, list(range(1, n_prompt + 1)), params, 99, max_tokens, sample_seed=0)


def _step(sched, sampled: dict[str, list[int]], proposed=None, verified=None):
    """Schedule, then report `sampled` tokens (and the runner's proposals / verifications)."""
    so = sched.schedule()
    ids = list(so.num_scheduled_tokens)
    out = ModelRunnerOutput(
        req_ids=ids,
        sampled_token_ids=[sampled.get(r, []) for r in ids],
        logprobs=[None] * len(ids),
        proposed_drafts=None if proposed is None else [proposed.get(r, 0) for r in ids],
        verified_drafts=None if verified is None else [verified.get(r, 0) for r in ids],
    )
    return so, sched.update_from_output(so, out)


def test_sync_gives_the_drafts_the_runner_proposed_and_takes_back_the_rejected():
    s = _scheduler(k=3)
    s.add_request(_request("a", 5))
    so, _ = _step(s, {"a": [7]}, proposed={"a": 2})
    assert so.scheduled_spec_tokens == {} and so.num_scheduled_tokens == {"a": 5}
    a = s.requests["a"]
    assert a.num_proposed_drafts == 2 and a.num_computed_tokens == 5
    so, outs = _step(s, {"a": [8, 9]}, proposed={"a": 3}, verified={"a": 2})
    assert so.num_scheduled_tokens == {"a": 3} and so.scheduled_spec_tokens == {"a": 2}
    # 3 positions computed, one draft rejected: its position is computed again.
    assert a.num_computed_tokens == 5 + 3 - 1
    assert (a.num_draft_tokens, a.num_accepted_tokens) == (2, 1)
    assert (outs[0].num_draft_tokens, outs[0].num_accepted_tokens) == (2, 1)
    assert (s.spec_stats.num_draft_tokens, s.spec_stats.num_accepted_tokens) == (2, 1)
    assert s.spec_stats.num_verifying_steps == 1
    so, _ = _step(s, {"a": [1, 2, 3, 4]}, proposed={"a": 0})  # verified_drafts not sent
    assert so.scheduled_spec_tokens == {"a": 3}
    assert (a.num_draft_tokens, a.num_accepted_tokens) == (5, 4)
    assert a.num_computed_tokens == 7 + 4
    so, _ = _step(s, {"a": [5]})
    assert so.scheduled_spec_tokens == {} and so.num_scheduled_tokens == {"a": 1}


def test_drafts_stop_short_of_max_tokens_and_max_model_len():
    s = _scheduler(k=4)
    s.add_request(_request("a", 5, max_tokens=4))
    _step(s, {"a": [7]}, proposed={"a": 4})
    so, _ = _step(s, {"a": [8]}, proposed={"a": 4}, verified={"a": 2})
    # 1 output, 4 allowed: 2 drafts and the bonus token at most.
    assert so.scheduled_spec_tokens == {"a": 2}
    s = _scheduler(k=4, max_model_len=9)
    s.add_request(_request("b", 5))
    _step(s, {"b": [7]}, proposed={"b": 4})
    so, _ = _step(s, {"b": [8]}, proposed={"b": 4}, verified={"b": 2})
    assert so.scheduled_spec_tokens == {"b": 2}  # 6 tokens of 9: 2 drafts and the bonus


def test_a_step_budget_leaves_room_for_the_token_itself_and_other_requests_get_the_rest():
    s = _scheduler(k=4, budget=8)
    for rid in "ab":
        s.add_request(_request(rid, 3))
    _step(s, {"a": [7], "b": [7]}, proposed={"a": 4, "b": 4})
    so, _ = _step(s, {"a": [8], "b": [8]}, proposed={"a": 4, "b": 4}, verified={"a": 4, "b": 2})
    assert so.scheduled_spec_tokens == {"a": 4, "b": 2}
    assert so.num_scheduled_tokens == {"a": 5, "b": 3}


def test_a_prompt_still_being_computed_gets_no_draft_slots():
    s = _scheduler(k=2, budget=4)
    s.add_request(_request("a", 6))
    so, _ = _step(s, {}, proposed={"a": 2})
    assert so.num_scheduled_tokens == {"a": 4} and so.scheduled_spec_tokens == {}
    so, _ = _step(s, {"a": [7]}, proposed={"a": 2})
    assert so.num_scheduled_tokens == {"a": 2} and so.scheduled_spec_tokens == {}
    so, _ = _step(s, {"a": [8]})
    assert so.scheduled_spec_tokens == {"a": 2}


def test_async_offers_the_most_drafts_before_the_runner_has_proposed_any():
    s = _scheduler(AsyncScheduler, k=3)
    s.add_request(_request("a", 5, max_tokens=3))
    first = s.schedule()
    second = s.schedule()  # the prompt's step is in flight; its token is a placeholder
    assert first.scheduled_spec_tokens == {}
    assert second.scheduled_spec_tokens == {"a": 1}  # 3 allowed, 1 in flight, 1 bonus
    a = s.requests["a"]
    assert a.num_output_placeholders == 1 + 1 + 1
    assert a.num_proposed_drafts == 0


def test_no_draft_slots_for_a_requests_last_token():
    s = _scheduler(k=3)
    s.add_request(_request("a", 5, max_tokens=2))
    _step(s, {"a": [7]}, proposed={"a": 3})
    a = s.requests["a"]
    assert s._draft_limit(a) == 0  # 1 output of 2: only the token itself, no draft
    so, _ = _step(s, {"a": [8]}, proposed={"a": 3})
    assert so.scheduled_spec_tokens == {} and so.num_scheduled_tokens == {"a": 1}


def test_tokens_in_flight_count_against_max_model_len():
    s = _scheduler(AsyncScheduler, k=3, max_model_len=9)
    s.add_request(_request("a", 5, max_tokens=20))
    s.schedule()
    second = s.schedule()  # 5 prompt tokens + 1 in flight of 9: 2 drafts and the bonus
    assert second.scheduled_spec_tokens == {"a": 2}


def test_draft_counts_are_what_the_runner_verified_not_the_slots():
    """Async: the step had slots for the most drafts, the runner had fewer to verify."""
    s = _scheduler(AsyncScheduler, k=3)
    s.add_request(_request("a", 5))
    first = s.schedule()
    s.update_from_output(first, _output(first, {"a": [7]}))
    so = s.schedule()
    assert so.scheduled_spec_tokens == {"a": 3}
    outs = s.update_from_output(so, _output(so, {"a": [8, 9]}, verified={"a": 1}))
    a = s.requests["a"]
    assert (a.num_draft_tokens, a.num_accepted_tokens) == (1, 1)
    assert (outs[0].num_draft_tokens, outs[0].num_accepted_tokens) == (1, 1)


def _output(so, sampled, verified=None) -> ModelRunnerOutput:
    ids = list(so.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=ids,
        sampled_token_ids=[sampled.get(r, []) for r in ids],
        logprobs=[None] * len(ids),
        verified_drafts=None if verified is None else [verified.get(r, 0) for r in ids],
    )


def test_what_the_runner_sent_reaches_the_engine_outputs():
    """Hidden rows of a request that sampled nothing (a prompt chunk) are reported on their
    own and the next request is still handled; logprobs, codes and hidden rows of a request
    that sampled go out with its token."""
    from omnistage.core.tensor_blob import tensor_to_blob

    s = _scheduler(k=1)
    s.add_request(_request("a", 3))
    s.add_request(_request("b", 2))
    so = s.schedule()
    assert list(so.num_scheduled_tokens) == ["a", "b"]
    rows = torch.arange(20.0).view(5, 4)
    logprobs = [([9, 1], [-0.1, -2.0], 0)]
    outs = s.update_from_output(
        so,
        ModelRunnerOutput(
            req_ids=["a", "b"],
            sampled_token_ids=[[], [9]],
            logprobs=[None, logprobs],
            hidden_states=tensor_to_blob(rows),
            hidden_starts=[2, 1],
            hidden_counts=[3, 2],
            sampled_codes=[[], [4, 5]],
        ),
    )
    chunk, token = outs
    assert (chunk.request_id, chunk.new_token_ids, chunk.hidden_start) == ("a", [], 2)
    assert torch.equal(chunk.hidden_states, rows[:3])
    assert (token.request_id, token.new_token_ids, token.hidden_start) == ("b", [9], 1)
    assert token.new_logprobs == logprobs and token.new_codes == [[4, 5]]
    assert torch.equal(token.hidden_states, rows[3:])
    assert s.requests["b"].output_codes == [[4, 5]] and s.requests["a"].output_codes == []
    so = s.schedule()
    ids = list(so.num_scheduled_tokens)
    assert "b" in ids
    outs = s.update_from_output(
        so,
        ModelRunnerOutput(req_ids=ids, sampled_token_ids=[[6] for _ in ids], logprobs=[]),
    )
    assert [o.new_logprobs for o in outs] == [None] * len(ids)  # the runner sent none
    assert [o.new_codes for o in outs] == [None] * len(ids)
    assert [(o.hidden_states, o.hidden_start) for o in outs] == [(None, 0)] * len(ids)
    assert [o.num_cached_tokens for o in outs] == [0] * len(ids)  # no block was full


def test_admission_holds_slots_for_the_drafts_too():
    """MTP's draft passes write k - 1 keys past the verified ones: a request is admitted
    with room for them."""
    s = _scheduler(k=3, method="mtp")
    s.add_request(_request("a", 4))
    s.schedule()
    assert s.num_lookahead_slots == 2  # MTP: k - 1
    assert s.kv.num_blocks("a") * 4 >= 4 + s.num_lookahead_slots


def test_the_slots_held_cover_every_scheduled_position_and_draft():
    """A decode with drafts is allocated its token, its draft slots and (MTP) the lookahead
    slots, from one block boundary to the next."""
    for method, lookahead in (("ngram", 0), ("mtp", 2)):
        s = _scheduler(k=3, method=method)
        s.add_request(_request("a", 4))  # exactly one block
        _step(s, {"a": [7]}, proposed={"a": 3})
        so = s.schedule()
        assert so.num_scheduled_tokens == {"a": 4} and so.scheduled_spec_tokens == {"a": 3}
        assert s.kv.num_blocks("a") * 4 >= 4 + 4 + lookahead


def test_a_prompts_last_token_alone_gets_no_draft_slots_even_async():
    s = _scheduler(cls=AsyncScheduler, k=3, budget=16)
    s.add_request(_request("a", 17))
    _step(s, {})  # 16 of its 17 prompt tokens
    so = s.schedule()
    assert so.num_scheduled_tokens == {"a": 1} and so.scheduled_spec_tokens == {}


def test_a_request_waits_until_its_lookahead_slots_fit_too():
    config = EngineConfig(
        model="unused",
        max_model_len=64,
        max_num_batched_tokens=32,
        max_num_seqs=8,
        block_size=4,
        speculative_config={"method": "mtp", "num_speculative_tokens": 3},
    )
    s = Scheduler(config, KVCacheManager(3, 4, 64, True))  # 8 slots
    s.add_request(_request("a", 8))  # 8 tokens + 2 lookahead slots do not fit
    assert s.schedule().num_scheduled_tokens == {} and s.requests["a"] in s.waiting
