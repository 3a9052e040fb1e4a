"""Generation features through the LLM API on a tiny model: seeds, n, stops, logprobs, chat."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from omnistage import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(str(tiny_llama), max_model_len=256)


def all_free(llm: LLM) -> bool:
    return llm.engine.num_free_kv_blocks() == llm.engine.num_usable_kv_blocks()


def test_seeded_sample_is_the_same_alone_and_in_a_batch(llm):
    target = SamplingParams(temperature=1.0, seed=1234, max_tokens=20, ignore_eos=True)
    alone = llm.generate("the seeded one", target, use_tqdm=False)[0].outputs[0].token_ids
    others = [
        SamplingParams(temperature=0.8, seed=s, max_tokens=5 + s % 17, ignore_eos=True)
        for s in range(15)
    ]
    prompts = [f"other prompt {i} " * (i % 4 + 1) for i in range(15)]
    prompts.insert(7, "the seeded one")
    others.insert(7, target)
    batched = llm.generate(prompts, others, use_tqdm=False)[7].outputs[0].token_ids
    assert alone == batched
    assert all_free(llm)


def test_n_gives_distinct_reproducible_samples(llm):
    params = SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=16, ignore_eos=True)
    first = llm.generate("abc", params, use_tqdm=False)[0]
    second = llm.generate("abc", params, use_tqdm=False)[0]
    samples = [tuple(o.token_ids) for o in first.outputs]
    assert [o.index for o in first.outputs] == [0, 1, 2, 3]
    assert len(set(samples)) == 4
    assert samples == [tuple(o.token_ids) for o in second.outputs]
    # Sample 0 of an n>1 request is the request's own seeded sample.
    single = llm.generate(
        "abc",
        SamplingParams(temperature=1.0, seed=7, max_tokens=16, ignore_eos=True),
        use_tqdm=False,
    )
    assert tuple(single[0].outputs[0].token_ids) == samples[0]
    assert all_free(llm)


def test_unseeded_sampling_differs_between_requests(llm):
    params = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    outs = llm.generate(["same"] * 4, params, use_tqdm=False)
    assert len({tuple(o.outputs[0].token_ids) for o in outs}) > 1


def test_stop_string_cuts_text_and_ends_generation(llm):
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    full = llm.generate("hello", greedy, use_tqdm=False)[0].outputs[0]
    text = full.text
    stop = text[10:13]
    assert stop and text.find(stop) >= 5
    cut = llm.generate("hello", greedy.clone(stop=[stop]), use_tqdm=False)[0].outputs[0]
    assert cut.text == text[: text.find(stop)]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert len(cut.token_ids) < len(full.token_ids)
    kept = llm.generate(
        "hello", greedy.clone(stop=[stop], include_stop_str_in_output=True), use_tqdm=False
    )[0]
    assert kept.outputs[0].text == text[: text.find(stop) + len(stop)]
    assert all_free(llm)


def test_stop_token_ids_and_eos(llm):
    greedy = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    full = llm.generate("xyz", greedy, use_tqdm=False)[0].outputs[0].token_ids
    stop_id = full[5]
    first = full.index(stop_id)
    out = llm.generate("xyz", greedy.clone(stop_token_ids=[stop_id]), use_tqdm=False)[0].outputs[0]
    assert out.token_ids == full[: first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_id
    # The same token as EOS (via logit_bias forcing eos=2) stops unless ignore_eos.
    forced = SamplingParams(temperature=0, max_tokens=10, logit_bias={2: 100.0})
    eos_out = llm.generate("xyz", forced, use_tqdm=False)[0].outputs[0]
    assert eos_out.token_ids == [2] and eos_out.finish_reason == "stop"
    min_out = llm.generate("xyz", forced.clone(min_tokens=4), use_tqdm=False)[0].outputs[0]
    assert len(min_out.token_ids) == 5 and 2 not in min_out.token_ids[:4]
    ign = llm.generate("xyz", forced.clone(ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert ign.token_ids == [2] * 10 and ign.finish_reason == "length"


def test_logprobs_match_transformers(llm, tiny_llama):
    params = SamplingParams(temperature=0, max_tokens=3, logprobs=5, ignore_eos=True)
    out = llm.generate({"prompt_token_ids": [10, 20, 30, 40]}, params, use_tqdm=False)[0].outputs[0]
    assert len(out.logprobs) == 3
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([[10, 20, 30, 40]])).logits[0, -1], -1)
    first = out.logprobs[0]
    top = torch.topk(ref, 5)
    assert set(top.indices.tolist()) <= set(first)
    for tid in top.indices.tolist():
        assert math.isclose(first[tid].logprob, ref[tid].item(), abs_tol=1e-4)
    sampled = out.token_ids[0]
    assert first[sampled].rank == 1  # greedy picks the top token
    assert out.cumulative_logprob == pytest.approx(
        sum(lp[t].logprob for lp, t in zip(out.logprobs, out.token_ids, strict=True))
    )


def test_chat_applies_the_template(llm):
    messages = [{"role": "user", "content": "hi"}]
    out = llm.chat(messages, SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)[0]
    assert out.prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert out.prompt_token_ids == llm.get_tokenizer().encode(out.prompt, add_special_tokens=False)
    with pytest.raises(ValueError, match="messages"):
        llm.chat([{"content": "no role"}], use_tqdm=False)


def test_text_equals_full_decode(llm):
    out = llm.generate(
        "decode me",
        SamplingParams(temperature=1.0, seed=3, max_tokens=40, ignore_eos=True),
        use_tqdm=False,
    )[0]
    completion = out.outputs[0]
    assert completion.text == llm.get_tokenizer().decode(
        completion.token_ids, skip_special_tokens=True
    )


def test_max_tokens_none_runs_to_the_context_limit(tiny_llama):
    small = LLM(str(tiny_llama), max_model_len=32)
    out = small.generate(
        {"prompt_token_ids": [5] * 20},
        SamplingParams(temperature=0, max_tokens=None, ignore_eos=True),
        use_tqdm=False,
    )
    assert len(out[0].outputs[0].token_ids) == 12 and out[0].outputs[0].finish_reason == "length"


def test_bfloat16_runs_and_stays_close_to_float32(tiny_llama):
    prompt = {"prompt_token_ids": [11, 22, 33, 44, 55]}
    params = SamplingParams(temperature=0, max_tokens=1, logprobs=3)
    f32 = (
        LLM(str(tiny_llama), dtype="float32").generate(prompt, params, use_tqdm=False)[0].outputs[0]
    )
    bf16 = (
        LLM(str(tiny_llama), dtype="bfloat16")
        .generate(prompt, params, use_tqdm=False)[0]
        .outputs[0]
    )
    top32 = f32.logprobs[0][f32.token_ids[0]].logprob
    assert bf16.token_ids == f32.token_ids
    assert abs(bf16.logprobs[0][bf16.token_ids[0]].logprob - top32) < 0.1


@pytest.mark.parametrize(
    ("flags", "packed"),
    [(frozenset({"avx2", "fma"}), False), (frozenset({"avx2", "avx512f", "avx512bw"}), True)],
    ids=["zen2-avx2-only", "avx512bw"],
)
def test_bfloat16_packs_only_where_the_cpu_can(tiny_llama, monkeypatch, flags, packed):
    """On an AVX2-only CPU (AMD Zen 2) oneDNN cannot pack bf16 weights: the linears stay plain
    and the model still runs (it used to crash at start); with avx512bw they are packed."""
    from omnistage.platforms import cpu_linear

    monkeypatch.setattr(cpu_linear, "cpu_flags", lambda: flags)
    llm = LLM(str(tiny_llama), dtype="bfloat16", async_scheduling=False)
    model = llm.engine.core.executor.runner.model
    kinds = {type(m) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    assert (cpu_linear.PackedLinear in kinds) == packed
    if not packed:
        assert not any(isinstance(m, cpu_linear.PackedLinear) for m in model.modules())
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    out = llm.generate({"prompt_token_ids": [11, 22, 33]}, params, use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4


def test_small_float32_linears_stay_plain_and_large_ones_are_packed():
    """oneDNN's call costs more than a small product: float32 linears under
    `PACK_MIN_WEIGHTS` weights keep `F.linear` (and its plain silu / mul / add), larger
    ones are packed (column panels on AVX-512 CPUs, else oneDNN); both give the product
    to float32 rounding."""
    from torch import nn

    from omnistage.layers.linear import Linear
    from omnistage.platforms import cpu_linear

    if not cpu_linear.onednn_available():
        pytest.skip("no oneDNN in this torch")
    side = math.isqrt(cpu_linear.PACK_MIN_WEIGHTS - 1) + 1  # side**2: the fewest packed
    model = nn.ModuleDict(
        {
            "small": Linear(side - 1, side - 1, dtype=torch.float32),
            "large": Linear(side, side, dtype=torch.float32),
        }
    )
    g = torch.Generator().manual_seed(0)
    for p in model.parameters():
        p.copy_(torch.randn(p.shape, generator=g) / side**0.5)
    x = {n: torch.randn(3, m.in_features, generator=g) for n, m in model.items()}
    other = {n: torch.randn(3, m.out_features, generator=g) for n, m in model.items()}
    expected = {n: [fn(m, x[n], other[n]) for fn in _LINEAR_FORMS] for n, m in model.items()}
    assert cpu_linear.pack_linears(model) == 1
    assert type(model["small"]) is Linear
    large = cpu_linear.PanelLinear if cpu_linear.float32_panels() else cpu_linear.PackedLinear
    assert isinstance(model["large"], large)
    for n, m in model.items():
        for fn, want in zip(_LINEAR_FORMS, expected[n], strict=True):
            torch.testing.assert_close(fn(m, x[n], other[n]), want, rtol=1e-5, atol=1e-5)


_LINEAR_FORMS = (
    lambda m, x, o: m(x),
    lambda m, x, o: m.silu(x),
    lambda m, x, o: m.mul(x, o),
    lambda m, x, o: m.add(x, o),
)
