"""Our models against transformers on tiny random checkpoints: logits and greedy tokens."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from omnistage import LLM, SamplingParams

PROMPTS = [
    [5, 17, 33, 9, 100],
    list(range(40, 77)),
    [7] * 3,
    list(range(200, 219)),
]


def capture_logits(llm: LLM) -> list[torch.Tensor]:
    """Record the logits of every sampling step (a sample observer on the runner)."""
    runner = llm.engine.core.executor.runner
    seen: list[torch.Tensor] = []
    runner.add_sample_observer(lambda event: seen.append(event.logits))
    return seen


@pytest.mark.parametrize(
    "arch", ["tiny_llama", "tiny_qwen2", "tiny_qwen3", "tiny_qwen2_moe", "tiny_qwen3_moe"]
)
def test_logits_match_transformers_for_a_mixed_length_batch(arch, request):
    path = request.getfixturevalue(arch)
    llm = LLM(str(path), max_num_batched_tokens=512, async_scheduling=False)
    seen = capture_logits(llm)
    llm.generate(
        [{"prompt_token_ids": p} for p in PROMPTS],
        SamplingParams(temperature=0, max_tokens=1),
        use_tqdm=False,
    )
    assert len(seen) == 1 and seen[0].shape[0] == len(PROMPTS)  # one step, all prompts together
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        for i, prompt in enumerate(PROMPTS):
            ref = hf(torch.tensor([prompt])).logits[0, -1]
            torch.testing.assert_close(seen[0][i], ref, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "arch", ["tiny_llama", "tiny_qwen2", "tiny_qwen3", "tiny_qwen2_moe", "tiny_qwen3_moe"]
)
def test_greedy_tokens_match_transformers_for_32_steps(arch, request):
    path = request.getfixturevalue(arch)
    llm = LLM(str(path))
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in PROMPTS],
        # EOS masked for all 32 steps, as transformers' min_new_tokens does.
        SamplingParams(temperature=0, max_tokens=32, min_tokens=32),
        use_tqdm=False,
    )
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for prompt, out in zip(PROMPTS, outs, strict=True):
        ids = torch.tensor([prompt])
        ref = hf.generate(
            ids, max_new_tokens=32, min_new_tokens=32, do_sample=False, pad_token_id=0
        )
        assert out.outputs[0].token_ids == ref[0, len(prompt) :].tolist()
    assert llm.engine.num_free_kv_blocks() == llm.engine.num_usable_kv_blocks()
