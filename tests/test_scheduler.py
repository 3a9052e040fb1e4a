"""Scheduler: token budget, chunked prefill, max_num_seqs, preemption, stop rules, freeing."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from omnistage.config import EngineConfig
from omnistage.core.kv_cache_manager import KVCacheManager
from omnistage.core.request import Request, RequestStatus
from omnistage.core.sched_output import ModelRunnerOutput, SchedulerOutput
from omnistage.core.scheduler import Scheduler
from omnistage.sampling_params import SamplingParams


def make_scheduler(num_blocks=64, block_size=4, budget=16, max_seqs=8, chunked=True, caching=True):
    config = EngineConfig(
        model="unused",
        max_model_len=64,
        max_num_batched_tokens=budget,
        max_num_seqs=max_seqs,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=caching,
        block_size=block_size,
    )
    kv = KVCacheManager(num_blocks, block_size, 64, caching)
    return Scheduler(config, kv)


def req(rid, n_prompt, max_tokens=4, first=0, **params) -> Request:
    sp = SamplingParams(max_tokens=max_tokens, **params)
    return Request(
        rid,
        list(range(first, first + n_prompt)),
        sp,
        eos_token_id=99,
        max_tokens=max_tokens,
        sample_seed=0,
    )


def fake_step(sched: Scheduler, token=7) -> tuple[SchedulerOutput, list]:
    """Run one step with a fake runner that samples `token` for every request done with its prompt."""
    so = sched.schedule()
    ids, sampled = [], []
    for rid in so.num_scheduled_tokens:
        r = sched.requests[rid]
        ids.append(rid)
        sampled.append([token] if r.num_computed_tokens >= r.num_tokens else [])
    out = ModelRunnerOutput(req_ids=ids, sampled_token_ids=sampled, logprobs=[None] * len(ids))
    return so, sched.update_from_output(so, out)


def test_chunked_prefill_respects_budget_and_decodes_share_steps():
    s = make_scheduler(budget=16)
    s.add_request(req("a", 40))
    so, _ = fake_step(s)
    assert so.num_scheduled_tokens == {"a": 16}
    s.add_request(req("b", 3))
    so, _ = fake_step(s)
    assert so.num_scheduled_tokens == {"a": 16}
    so, outs = fake_step(s)
    # a's last 8 prompt tokens, and b's 3 tokens fill the rest of the budget
    assert so.num_scheduled_tokens == {"a": 8, "b": 3}
    assert {o.request_id for o in outs} == {"a", "b"}
    so, _ = fake_step(s)
    assert so.num_scheduled_tokens == {"a": 1, "b": 1}


def test_no_chunking_waits_for_room():
    s = make_scheduler(budget=64, chunked=False)
    s.add_request(req("a", 40))
    s.add_request(req("b", 30, first=100))
    so, _ = fake_step(s)
    assert so.num_scheduled_tokens == {"a": 40}


def test_max_num_seqs():
    s = make_scheduler(budget=64, max_seqs=2)
    for i in range(4):
        s.add_request(req(f"r{i}", 2, first=10 * i))
    so, _ = fake_step(s)
    assert set(so.num_scheduled_tokens) == {"r0", "r1"}


def test_preemption_frees_and_recomputes_latest_arrival():
    s = make_scheduler(num_blocks=5, block_size=4, budget=64)  # 4 usable blocks = 16 tokens
    s.add_request(req("a", 8, max_tokens=8))
    s.add_request(req("b", 8, max_tokens=8, first=50))
    fake_step(s)  # both prefilled: 2 blocks each, 8 tokens each
    so, _ = fake_step(s)  # both need a 3rd block at token 9: b is preempted
    assert "b" in so.preempted_req_ids
    b = s.requests["b"]
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert b.output_token_ids == [7]  # confirmed outputs survive preemption
    with pytest.raises(ValueError, match="request_id: 'b' is already running"):
        s.add_request(req("b", 3))
    while s.has_unfinished_requests():
        fake_step(s)
    assert s.kv.num_free_blocks == 4


def test_preempt_running_preempts_everyone_in_running_order_and_counts_each():
    s = make_scheduler()
    s.add_request(req("a", 8, max_tokens=8))
    s.add_request(req("b", 2, max_tokens=8, first=50))
    fake_step(s)
    assert [r.request_id for r in s.running] == ["a", "b"] and s.num_preemptions == 0
    s.preempt_running()
    assert s.num_preemptions == 2 and not s.running
    assert [r.request_id for r in s.waiting] == ["a", "b"]  # a runs first again
    assert all(s.requests[r].num_computed_tokens == 0 for r in "ab")
    assert all(s.requests[r].output_token_ids == [7] for r in "ab")
    assert s.kv.num_free_blocks == 63
    so, _ = fake_step(s)
    assert so.preempted_req_ids == {"a", "b"}  # the runner hears of it
    a = s.requests["a"]  # recomputed from its own cached blocks (8 tokens hit) ...
    assert a.num_computed_tokens == 9 and a.num_cached_tokens == 0  # ... as first admitted
    assert set(so.num_scheduled_tokens) == {"a", "b"}  # and both are recomputed


def test_a_request_that_can_only_preempt_itself_waits():
    """5 usable blocks: a and b hold 2 each; both need a third. a takes the free one; b,
    the tail of `running`, finds no one but itself to preempt: it waits, unscheduled."""
    s = make_scheduler(num_blocks=6, block_size=4, budget=64)
    s.add_request(req("a", 8, max_tokens=8))
    s.add_request(req("b", 8, max_tokens=8, first=50))
    fake_step(s)
    so, _ = fake_step(s)
    assert so.preempted_req_ids == {"b"} and set(so.num_scheduled_tokens) == {"a"}
    assert s.requests["b"].status == RequestStatus.PREEMPTED
    assert [r.request_id for r in s.waiting] == ["b"] and [r.request_id for r in s.running] == ["a"]
    while s.has_unfinished_requests():
        fake_step(s)
    assert s.kv.num_free_blocks == 5


def test_a_config_not_resolved_for_its_model_is_refused():
    for unresolved in ({"max_model_len": None}, {"max_num_batched_tokens": None}):
        resolved = EngineConfig(model="unused", max_model_len=64, max_num_batched_tokens=16)
        config = dataclasses.replace(resolved, **unresolved)
        with pytest.raises(ValueError) as err:
            Scheduler(config, KVCacheManager(8, 4, 64, True))
        assert str(err.value) == "Scheduler needs a config resolved for its model"


def test_stop_rules_and_release():
    s = make_scheduler()
    s.add_request(req("len", 2, max_tokens=3))
    s.add_request(req("eos", 2, max_tokens=10, first=20))
    s.add_request(req("stopid", 2, max_tokens=10, first=30, stop_token_ids=[7]))
    s.add_request(req("min", 2, max_tokens=10, first=40, min_tokens=3))
    s.add_request(req("ign", 2, max_tokens=2, first=50, ignore_eos=True))
    finished = {}
    for _ in range(12):
        if not s.has_unfinished_requests():
            break
        so = s.schedule()
        ids = list(so.num_scheduled_tokens)
        toks = [[7] if r == "stopid" else [99] if r != "len" else [5] for r in ids]
        out = ModelRunnerOutput(req_ids=ids, sampled_token_ids=toks, logprobs=[None] * len(ids))
        for o in s.update_from_output(so, out):
            if o.finished:
                finished[o.request_id] = (o.finish_reason, o.stop_reason)
    assert finished["len"] == ("length", None)
    assert finished["eos"] == ("stop", None)
    assert finished["stopid"] == ("stop", 7)
    assert finished["min"] == ("stop", None)
    assert finished["ign"] == ("length", None)
    assert s.kv.num_free_blocks == 63


def test_min_tokens_delays_eos_stop():
    s = make_scheduler()
    s.add_request(req("m", 2, max_tokens=10, min_tokens=3))
    n = 0
    while s.has_unfinished_requests():
        fake_step(s, token=99)
        n += 1
    assert n == 3


def test_abort_frees_blocks_and_tells_runner():
    s = make_scheduler()
    s.add_request(req("a", 10))
    s.add_request(req("w", 10, first=40))
    fake_step(s)
    held = [s.requests["a"], s.requests["w"]]
    s.finish_requests(["unknown", "a", "w"], RequestStatus.FINISHED_ABORTED)  # unknown: skipped
    assert not s.has_unfinished_requests()
    assert all(r.status == RequestStatus.FINISHED_ABORTED for r in held)  # for whoever holds it
    assert s.kv.num_free_blocks == 63
    so = s.schedule()
    assert so.finished_req_ids == {"a", "w"} and so.is_empty


def test_async_request_preempted_while_its_stop_token_is_in_flight():
    """Found by the randomized sync≡async test: the in-flight token of a request that was
    preempted meanwhile is real, is appended, and may end the request from the waiting queue."""
    from omnistage.core.async_scheduler import AsyncScheduler

    config = EngineConfig(model="unused", max_model_len=64, max_num_batched_tokens=64, block_size=4)
    s = AsyncScheduler(config, KVCacheManager(5, 4, 64, True))  # 4 usable blocks
    s.add_request(req("a", 8, max_tokens=8))
    s.add_request(req("b", 8, max_tokens=8, first=50))
    first = s.schedule()  # both prompts: 2 blocks each, one token in flight each
    assert s.requests["a"].num_output_placeholders == 1
    second = s.schedule()  # a's in-flight token needs a 3rd block: b is preempted
    assert second.preempted_req_ids == {"b"} and second.num_scheduled_tokens == {"a": 1}
    out = ModelRunnerOutput(
        req_ids=["a", "b"], sampled_token_ids=[[7], [99]], logprobs=[None, None]
    )
    finished = {o.request_id: o.finish_reason for o in s.update_from_output(first, out)}
    assert finished == {"a": None, "b": "stop"}  # b's real token (EOS) ends it while it waits
    assert "b" not in s.requests and all(r.request_id != "b" for r in s.waiting)
    assert s.kv.num_free_blocks == 1  # only a's 3 blocks are held


def test_an_isolated_suspect_runs_alone_to_the_end_of_its_prompt():
    s = make_scheduler(budget=16)
    s.add_request(req("a", 30))
    s.add_request(req("b", 3, first=50))
    s.isolation.suspect(["a", "b"])
    for _ in range(2):  # its prompt in two chunks, the second as a running request
        so, _ = fake_step(s)
        assert list(so.num_scheduled_tokens) == ["a"]


def test_the_last_token_of_the_budget_is_used():
    s = make_scheduler(budget=2)
    for rid, first in (("a", 0), ("b", 50)):
        s.add_request(req(rid, 1, max_tokens=4, first=first))
        fake_step(s)  # prefilled alone: a one-token prompt
    so, _ = fake_step(s)
    assert so.num_scheduled_tokens == {"a": 1, "b": 1}  # two decodes fill a budget of 2
    s.add_request(req("c", 8, first=100))
    s.finish_requests(["b"], RequestStatus.FINISHED_ABORTED)
    so, _ = fake_step(s)
    assert so.num_scheduled_tokens == {"a": 1, "c": 1}  # a chunk of the one token left


def test_a_new_request_reaches_the_runner_with_its_embeddings_and_positions():
    from omnistage.core.multimodal_inputs import MultimodalDecoderInputs
    from omnistage.core.tensor_blob import blob_to_tensor

    s = make_scheduler()
    embedded = req("e", 5)
    embedded.prompt_embeds = torch.arange(10.0).view(5, 2)
    positioned = req("m", 5, first=50)
    positions = torch.arange(15).view(3, 5)
    positioned.mm_decoder_inputs = MultimodalDecoderInputs(mrope_positions=positions, rope_delta=-1)
    coded = req("c", 3, first=100)  # recomputed after a preemption: its tokens' codes too
    coded.output_token_ids, coded.output_codes = [7], [[1, 2]]
    s.add_request(coded)
    s.add_request(embedded)
    s.add_request(positioned)
    new = {r.req_id: r for r in s.schedule().scheduled_new_reqs}
    assert torch.equal(blob_to_tensor(new["e"].prompt_embeds), embedded.prompt_embeds)
    assert new["e"].mm_decoder_inputs is None and new["m"].prompt_embeds is None
    data = new["m"].mm_decoder_inputs
    assert torch.equal(blob_to_tensor(data.mrope_positions), positions) and data.rope_delta == -1
    assert new["c"].output_codes == [[1, 2]] and new["c"].output_token_ids == [7]


def test_without_chunked_prefill_a_prompt_that_fills_the_budget_runs():
    s = make_scheduler(budget=64, chunked=False)
    s.add_request(req("a", 60))
    s.add_request(req("b", 4, first=100))  # exactly the 4 tokens left
    assert s.schedule().num_scheduled_tokens == {"a": 60, "b": 4}
