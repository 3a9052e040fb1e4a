"""Scheduling choices must not change outputs (float64 tiny model, exact token equality).

Prefix caching on vs off, chunked prefill on vs off, preemption forced by a
tiny KV cache vs ample memory, one request alone vs inside a batch of 16. After
every workload all KV blocks are free again (DESIGN.md invariant 8).
"""

from __future__ import annotations

import random

import pytest

from omnistage import LLM, SamplingParams

MAX_TOKENS = 24


def workload() -> tuple[list[dict], list[SamplingParams]]:
    rng = random.Random(7)
    shared = [rng.randrange(3, 300) for _ in range(40)]  # a common prefix for prefix caching
    prompts, params = [], []
    for i in range(16):
        n = rng.randrange(3, 70)
        body = [rng.randrange(3, 300) for _ in range(n)]
        ids = shared[: rng.choice([0, 17, 33, 40])] + body
        prompts.append({"prompt_token_ids": ids})
        if i % 2 == 0:
            params.append(SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True))
        else:
            params.append(
                SamplingParams(
                    temperature=0.9,
                    top_p=0.9,
                    top_k=50,
                    seed=100 + i,
                    max_tokens=MAX_TOKENS - i % 5,
                    ignore_eos=True,
                )
            )
    return prompts, params


def run(path, **engine_args) -> tuple[list[list[int]], LLM]:
    llm = LLM(str(path), dtype="float64", **engine_args)
    prompts, params = workload()
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.engine.num_free_kv_blocks() == llm.engine.num_usable_kv_blocks()
    assert llm.engine.core.scheduler.num_unfinished_requests == 0
    return [o.outputs[0].token_ids for o in outs], llm


@pytest.fixture(scope="module")
def reference(tiny_llama_f64):
    tokens, _ = run(
        tiny_llama_f64,
        enable_prefix_caching=False,
        enable_chunked_prefill=False,
        max_num_batched_tokens=4096,
        max_model_len=256,
    )
    assert all(len(t) > 0 for t in tokens)
    return tokens


def test_prefix_caching_does_not_change_outputs(tiny_llama_f64, reference):
    tokens, llm = run(tiny_llama_f64, enable_prefix_caching=True, max_model_len=256, max_num_seqs=4)
    assert tokens == reference
    assert llm.engine.kv_cache_manager.prefix_hits > 0  # the cache was really used


def test_chunked_prefill_does_not_change_outputs(tiny_llama_f64, reference):
    tokens, _ = run(
        tiny_llama_f64,
        enable_prefix_caching=False,
        enable_chunked_prefill=True,
        max_num_batched_tokens=24,
        max_model_len=256,
    )
    assert tokens == reference


def test_preemption_does_not_change_outputs(tiny_llama_f64, reference):
    tokens, llm = run(
        tiny_llama_f64,
        num_kv_blocks=17,
        block_size=16,
        max_model_len=256,
        max_num_batched_tokens=64,
    )
    assert llm.engine.core.scheduler.num_preemptions > 0  # the tiny budget really preempted
    assert tokens == reference


def test_alone_equals_in_batch(tiny_llama_f64, reference):
    llm = LLM(str(tiny_llama_f64), dtype="float64", max_model_len=256)
    prompts, params = workload()
    for i in (0, 1, 6, 13):
        out = llm.generate(prompts[i], params[i], use_tqdm=False)[0]
        assert out.outputs[0].token_ids == reference[i]
    assert llm.engine.num_free_kv_blocks() == llm.engine.num_usable_kv_blocks()
