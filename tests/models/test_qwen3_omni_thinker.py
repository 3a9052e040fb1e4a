"""The Qwen3-Omni thinker (text in) on our hot path, against transformers' thinker.

One checkpoint in the real layout; the stage loads only its part
(`model_part="thinker"`: `thinker.model.*`, `thinker.lm_head.*`). For text-only
input the thinker's three rotary position rows are equal, so its multimodal
RoPE reduces to ordinary RoPE (theta 1e6) — what our Qwen3-MoE decoder runs.
transformers computes RMSNorm, router softmax and the rotary tables in float32
even for a float64 model, hence the tolerances.
"""

from __future__ import annotations

import pytest
import torch

from omnistage import LLM, SamplingParams
from omnistage.families.qwen3_omni.tiny import make_tiny_qwen3_omni

PROMPTS = [[5, 17, 33, 9, 100], list(range(40, 77)), [7] * 3]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_qwen3_omni(tmp_path_factory.mktemp("qwen3-omni"), dtype=torch.float64)


@pytest.fixture(scope="module")
def reference(ckpt):
    from transformers import Qwen3OmniMoeForConditionalGeneration

    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        ckpt, dtype=torch.float64, experts_implementation="eager"
    )
    return model.thinker.eval()


def test_thinker_logits_and_greedy_tokens_match_transformers(ckpt, reference):
    llm = LLM(str(ckpt), model_part="thinker", dtype="float64", async_scheduling=False)
    runner = llm.engine.core.executor.runner
    seen: list[torch.Tensor] = []
    runner.add_sample_observer(lambda event: seen.append(event.logits))
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in PROMPTS],
        SamplingParams(temperature=0, max_tokens=16, min_tokens=16),
        use_tqdm=False,
    )
    first_step = seen[0]
    for i, prompt in enumerate(PROMPTS):
        with torch.no_grad():
            ref = reference(input_ids=torch.tensor([prompt])).logits[0, -1]
        torch.testing.assert_close(first_step[i].double(), ref, rtol=1e-4, atol=1e-4)
        generated = reference.generate(
            torch.tensor([prompt]),
            max_new_tokens=16,
            min_new_tokens=16,
            do_sample=False,
            pad_token_id=0,
        )
        assert outs[i].outputs[0].token_ids == generated[0, len(prompt) :].tolist()


def test_unknown_part_is_named(ckpt):
    with pytest.raises(
        ValueError, match="model_part: 'qwen3_omni_moe' checkpoints have no part 'mouth'"
    ):
        LLM(str(ckpt), model_part="mouth", async_scheduling=False)
