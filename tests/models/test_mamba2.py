"""Mamba2 on our recurrent-state hot path against transformers (tiny float64 checkpoint).

Logits of a mixed-length batch in one step, greedy tokens over 64 steps (sync and
async), a prompt prefilled in chunks over several steps, recompute after
preemption under a tiny KV budget (slots all free afterwards), and prefix
caching turned off with a log line.
"""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import AutoModelForCausalLM

from omnistage import LLM, SamplingParams
from tests.test_model_parity import PROMPTS, capture_logits

STEPS = 64
LONG_PROMPT = [(7 * i + 3) % 300 + 3 for i in range(50)]


@pytest.fixture(scope="module")
def hf_model(tiny_mamba2):
    return AutoModelForCausalLM.from_pretrained(tiny_mamba2, dtype=torch.float64).eval()


def hf_greedy(hf_model, prompts: list[list[int]], steps: int) -> list[list[int]]:
    """transformers' greedy tokens, the prompts batched with left padding (exact for
    Mamba2: padded positions enter as zeros, like the zero initial state)."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = hf_model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=steps,
            min_new_tokens=steps,
            do_sample=False,
            pad_token_id=0,
        )
    return out[:, width:].tolist()


@pytest.fixture(scope="module")
def hf_tokens(hf_model) -> list[list[int]]:
    return hf_greedy(hf_model, PROMPTS, STEPS)


def greedy(steps: int) -> SamplingParams:
    # EOS masked for every step, as transformers' min_new_tokens does.
    return SamplingParams(temperature=0, max_tokens=steps, min_tokens=steps)


def generate(llm: LLM, prompts: list[list[int]], steps: int) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy(steps), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def assert_all_released(llm: LLM) -> None:
    """KV blocks and (with the runner in this process) state slots are all free again."""
    engine = llm.engine
    assert engine.num_free_kv_blocks() == engine.num_usable_kv_blocks()
    runner = getattr(engine.core.executor, "runner", None)
    if runner is not None:
        slots = runner.recurrent
        assert slots.num_used == 0 and slots.num_free == slots.num_slots


def test_logits_match_transformers_for_a_mixed_length_batch(tiny_mamba2, hf_model):
    llm = LLM(str(tiny_mamba2), dtype="float64", max_num_batched_tokens=512, async_scheduling=False)
    seen = capture_logits(llm)
    generate(llm, PROMPTS, 1)
    assert len(seen) == 1 and seen[0].shape[0] == len(PROMPTS)  # one step, all prompts together
    with torch.no_grad():
        for i, prompt in enumerate(PROMPTS):
            ref = hf_model(torch.tensor([prompt])).logits[0, -1]
            # transformers runs parts of Mamba2 in float32 even for a float64 model.
            torch.testing.assert_close(seen[0][i].double(), ref.double(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "async_scheduling, backend", [(False, "inline"), (True, "thread"), (True, "process")]
)
def test_greedy_tokens_match_transformers_for_64_steps(
    tiny_mamba2, hf_tokens, async_scheduling, backend
):
    llm = LLM(
        str(tiny_mamba2),
        dtype="float64",
        async_scheduling=async_scheduling,
        executor_backend=backend,
    )
    assert generate(llm, PROMPTS, STEPS) == hf_tokens
    assert_all_released(llm)


def test_chunked_prefill_matches_transformers(tiny_mamba2, hf_model):
    llm = LLM(
        str(tiny_mamba2),
        dtype="float64",
        enable_chunked_prefill=True,
        max_num_batched_tokens=16,
        max_model_len=128,
        async_scheduling=False,
    )
    runner = llm.engine.core.executor.runner
    chunks: list[int] = []
    original = runner.execute_model

    def recording(so):
        chunks.extend(n for n in so.num_scheduled_tokens.values() if n > 1)
        return original(so)

    runner.execute_model = recording
    prompts = [LONG_PROMPT, PROMPTS[0]]
    tokens = generate(llm, prompts, 16)
    assert tokens == hf_greedy(hf_model, prompts, 16)
    assert len(chunks) >= 4 and max(chunks) <= 16  # the long prompt took several steps
    assert_all_released(llm)


def test_recompute_after_preemption_matches_transformers(tiny_mamba2, hf_tokens):
    llm = LLM(
        str(tiny_mamba2),
        dtype="float64",
        max_model_len=112,
        block_size=16,
        num_kv_blocks=8,
        async_scheduling=False,
    )
    assert generate(llm, PROMPTS, STEPS) == hf_tokens
    assert llm.engine.core.scheduler.num_preemptions > 0
    assert_all_released(llm)


def test_prefix_caching_is_disabled_with_a_log_line(tiny_mamba2, caplog):
    with caplog.at_level(logging.INFO, logger="omnistage"):
        llm = LLM(
            str(tiny_mamba2), dtype="float64", enable_prefix_caching=True, async_scheduling=False
        )
    assert not llm.engine.kv_cache_manager.enable_caching
    assert any(
        "prefix caching disabled" in r.getMessage() and "Mamba2ForCausalLM" in r.getMessage()
        for r in caplog.records
    )
