"""Our HunyuanImage-3 decoder against the reference implementation's, on the same tiny
random weights (float32).

`tests/fixtures/hunyuan_image3/decoder.pt` holds the reference's greedy continuation
and logits, made by `make_decoder_fixture.py` (its docstring says how) from the
official `hunyuan_image_3/hunyuan.py` modules, loading our checkpoint with strict
names. Tolerance: 1e-4 absolute on logits of magnitude ~6 (measured: 7.4e-6; float32,
different summation orders: per-expert vs dispatch-mask MoE, paged vs SDPA attention).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from omnistage import LLM, SamplingParams
from omnistage.families.hunyuan_image3.tiny import make_tiny_hunyuan_image3

FIXTURE = torch.load(
    Path(__file__).parents[1] / "fixtures" / "hunyuan_image3" / "decoder.pt", weights_only=True
)
ATOL = 1e-4


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = make_tiny_hunyuan_image3(tmp_path_factory.mktemp("hy3"), seed=FIXTURE["seed"])
    state = load_file(str(path / "model.safetensors"))
    assert sum(t.double().sum() for t in state.values()) == pytest.approx(
        FIXTURE["weights_sum"], rel=1e-12
    )  # the weights the reference ran
    return LLM(str(path), dtype="float32", executor_backend="thread", max_num_batched_tokens=512)


def observe(llm: LLM) -> list[torch.Tensor]:
    seen: list[torch.Tensor] = []
    llm.engine.core.executor.runner.add_sample_observer(lambda event: seen.append(event.logits))
    return seen


def test_prefill_logits_of_every_prefix_match_reference_in_one_batch(llm):
    prompts, expected = [], []
    for record in FIXTURE["records"]:
        sequence = record["prompt"] + record["tokens"]
        for k in range(len(record["tokens"])):
            prompts.append({"prompt_token_ids": sequence[: len(record["prompt"]) + k]})
            expected.append(record["logits"][k])
    seen = observe(llm)
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
    assert len(seen) == 1 and seen[0].shape[0] == len(prompts)  # one mixed-length batch
    torch.testing.assert_close(seen[0], torch.stack(expected), atol=ATOL, rtol=0)


def test_decode_steps_match_reference_until_its_sampler_ends_the_answer(llm):
    """Greedy decoding with the KV cache gives the reference's tokens and logits; the
    reference decoder alone goes on after a ratio token, where our model's own sampler
    ends the answer (what the reference's generation does: ratio -> end)."""
    for record in FIXTURE["records"]:
        seen = observe(llm)
        out = llm.generate(
            {"prompt_token_ids": record["prompt"]},
            SamplingParams(temperature=0, max_tokens=len(record["tokens"])),
            use_tqdm=False,
        )[0]
        tokens = list(out.outputs[0].token_ids)
        ratio = next(i for i, t in enumerate(record["tokens"]) if 270 <= t <= 306)
        assert tokens[: ratio + 1] == record["tokens"][: ratio + 1]
        assert tokens[ratio + 1 :] == [2]  # the end, forced after the ratio token
        logits = torch.cat(seen)[: ratio + 1]
        torch.testing.assert_close(logits, record["logits"][: ratio + 1], atol=ATOL, rtol=0)
