"""The built-in real model, SmolLM2-135M-Instruct from its GGUF: it must know Paris."""

from __future__ import annotations

import pytest

from omnistage import LLM, SamplingParams


@pytest.fixture(scope="module")
def smollm2():
    return LLM("smollm2", max_model_len=1024, max_num_seqs=16)


def test_greedy_chat_knows_the_capital_of_france(smollm2):
    out = smollm2.chat(
        [{"role": "user", "content": "What is the capital of France?"}],
        SamplingParams(temperature=0, max_tokens=32),
        use_tqdm=False,
    )[0].outputs[0]
    assert "Paris" in out.text
    assert out.finish_reason in ("stop", "length")


def test_real_model_batch_equals_alone_and_frees_blocks(smollm2):
    questions = ["What is the capital of France?", "Name a primary color.", "What is 2 + 2?"]
    params = SamplingParams(temperature=0, max_tokens=24)
    convs = [[{"role": "user", "content": q}] for q in questions]
    together = [o.outputs[0].token_ids for o in smollm2.chat(convs, params, use_tqdm=False)]
    alone = [smollm2.chat(c, params, use_tqdm=False)[0].outputs[0].token_ids for c in convs]
    assert together == alone
    engine = smollm2.engine
    assert engine.num_free_kv_blocks() == engine.num_usable_kv_blocks()
