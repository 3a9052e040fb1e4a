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


QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "What is 12 times 12?",
    "Who wrote Romeo and Juliet?",
    "What is the boiling point of water?",
    "Translate 'hello' to Spanish.",
    "What is the largest planet?",
    "Give me a synonym for happy.",
    "What is photosynthesis?",
    "How many days are in a leap year?",
    "What is the chemical symbol for gold?",
    "Name a mammal that flies.",
    "What language is spoken in Brazil?",
    "What is the square root of 81?",
    "Who painted the Mona Lisa?",
    "What is the freezing point of water in Fahrenheit?",
    "Name the longest river in Africa.",
    "What do bees make?",
    "How many continents are there?",
    "What is the opposite of cold?",
    "Write a haiku about the sea.",
    "What is 7 plus 8?",
    "Name a famous scientist.",
    "What is the capital of Japan?",
    "What color is the sky on a clear day?",
    "What is an atom?",
    "Suggest a name for a cat.",
    "What is the tallest mountain?",
    "Explain gravity in one sentence.",
    "What is the currency of the UK?",
    "How many legs does a spider have?",
    "What is a prime number?",
]


def test_sync_equals_async_token_for_token():
    convs = [[{"role": "user", "content": q}] for q in QUESTIONS]
    params = SamplingParams(temperature=0, max_tokens=32)
    tokens = {}
    for mode in (False, True):
        llm = LLM("smollm2", max_model_len=512, max_num_seqs=32, async_scheduling=mode)
        tokens[mode] = [o.outputs[0].token_ids for o in llm.chat(convs, params, use_tqdm=False)]
        engine = llm.engine
        assert engine.num_free_kv_blocks() == engine.num_usable_kv_blocks()
        engine.shutdown()
    assert len(tokens[True]) == 32
    assert tokens[True] == tokens[False]
