"""Qwen3-Next and Qwen3.5 (gated delta-net hybrids) against transformers, and their ops.

- The ops: the chunked and the recurrent gated delta rule agree with each other and with
  transformers' torch references, with and without an initial state, across chunk
  boundaries; the causal conv1d with state agrees with transformers' conv functions.
- The layer on hand-built `RecurrentMetadata`: any split of the requests' tokens into
  steps (fresh prompts of one token, prefill chunks, decodes mixed in one step, stale
  slots) gives the outputs and states of one pass; a speculative row saves the state
  after each token, and `commit_accepted` restores exactly the state of its first a+1.
- The engine on tiny float64 checkpoints: logits of a mixed-length batch in one step,
  greedy tokens over 64 steps (sync and async), chunked prefill and recompute after
  preemption all match transformers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.models.qwen3_next import modeling_qwen3_next as hf_next

from omnistage import LLM, SamplingParams
from omnistage.families.qwen3_next.causal_conv1d import causal_conv1d, causal_conv1d_step
from omnistage.families.qwen3_next.gated_delta_net import GatedDeltaNet
from omnistage.families.qwen3_next.gated_delta_rule import (
    chunked_gated_delta_rule,
    l2_normalize,
    recurrent_gated_delta_rule,
)
from omnistage.layers.forward_context import forward_context
from omnistage.layers.recurrent_state import RecurrentMetadata
from omnistage.models.tiny_checkpoints import tiny_config
from omnistage.worker.recurrent import (
    allocate_recurrent_state,
    commit_accepted,
)
from tests.test_model_parity import PROMPTS, capture_logits

F64 = torch.float64
STEPS = 64
CHUNK = 8  # our chunked form's chunk size in these tests: prompts cross it
LONG_PROMPT = [(7 * i + 3) % 300 + 3 for i in range(50)]
ARCHS = ["tiny_qwen3_next", "tiny_qwen3_5"]


# -- the ops ---------------------------------------------------------------------------------------
def rule_inputs(length: int, k_heads: int = 2, v_heads: int = 4, dk: int = 8, dv: int = 6):
    g = torch.Generator().manual_seed(length)
    q = torch.randn(length, k_heads, dk, generator=g, dtype=F64)
    k = torch.randn(length, k_heads, dk, generator=g, dtype=F64)
    v = torch.randn(length, v_heads, dv, generator=g, dtype=F64)
    decay = -2 * torch.rand(length, v_heads, generator=g, dtype=F64)
    beta = torch.rand(length, v_heads, generator=g, dtype=F64)
    state = torch.randn(v_heads, dk, dv, generator=g, dtype=F64)
    return q, k, v, decay, beta, state


def ours(q, k, v, decay, beta, state, chunked: bool):
    group = v.shape[1] // k.shape[1]
    qn = (l2_normalize(q) * q.shape[-1] ** -0.5).repeat_interleave(group, dim=1)
    kn = l2_normalize(k).repeat_interleave(group, dim=1)
    if chunked:
        return chunked_gated_delta_rule(qn, kn, v, decay, beta, state, CHUNK)
    out, states = recurrent_gated_delta_rule(qn, kn, v, decay, beta, state)
    return out, states[-1]


@pytest.mark.parametrize("length", [1, 7, 8, 9, 37])
@pytest.mark.parametrize("with_state", [False, True])
def test_chunked_and_recurrent_rules_match_transformers(length, with_state):
    q, k, v, decay, beta, state = rule_inputs(length)
    if not with_state:
        state = torch.zeros_like(state)
    chunk_out, chunk_state = ours(q, k, v, decay, beta, state, chunked=True)
    rec_out, rec_state = ours(q, k, v, decay, beta, state, chunked=False)
    torch.testing.assert_close(chunk_out, rec_out, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(chunk_state, rec_state, atol=1e-12, rtol=1e-12)
    kwargs = dict(
        initial_state=state[None] if with_state else None,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    args = (q[None], k[None], v[None], decay[None], beta[None])
    for ref_out, ref_state in (
        hf_next.torch_chunk_gated_delta_rule(*args, chunk_size=CHUNK, **kwargs),
        hf_next.torch_recurrent_gated_delta_rule(*args, **kwargs),
    ):
        # transformers computes the rule in float32 whatever the inputs' dtype.
        torch.testing.assert_close(chunk_out, ref_out[0], atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(chunk_state, ref_state[0].double(), atol=2e-5, rtol=2e-5)


def test_causal_conv1d_with_state_matches_transformers():
    g = torch.Generator().manual_seed(0)
    channels, kernel, length = 6, 4, 13
    x = torch.randn(length, channels, generator=g, dtype=F64)
    weight = torch.randn(channels, kernel, generator=g, dtype=F64)
    ref = hf_next.causal_conv1d_fn(x.t()[None], weight)[0].t()
    # The first 5 tokens from a zero state, the next 7 continuing, then one as a decode step.
    out_a, padded = causal_conv1d(x[:5], torch.zeros(kernel - 1, channels, dtype=F64), weight)
    out_b, padded = causal_conv1d(x[5:12], padded[-(kernel - 1) :], weight)
    out_c, _ = causal_conv1d_step(x[12:], padded[-(kernel - 1) :][None], weight)
    torch.testing.assert_close(torch.cat([out_a, out_b, out_c]), ref, atol=1e-12, rtol=1e-12)
    hf_state = padded[-kernel:].t()[None].clone()  # transformers' update keeps K inputs
    hf_out = hf_next.causal_conv1d_update(x[12:].t()[None, :, :], hf_state, weight)
    torch.testing.assert_close(out_c, hf_out[0].t(), atol=1e-12, rtol=1e-12)


# -- the layer on hand-built metadata --------------------------------------------------------------
NUM_SLOTS = 6


def make_layer(spec_positions: int = 0) -> tuple[GatedDeltaNet, list]:
    torch.manual_seed(0)
    layer = GatedDeltaNet(tiny_config("qwen3_5"), F64)
    layer.chunk_size = CHUNK
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.2)
            elif name == "norm_weight":
                p.normal_(1.0, 0.1)
            else:
                p.normal_(0, 0.1)
    states = allocate_recurrent_state([layer.state_shapes()], NUM_SLOTS, F64, "cpu", spec_positions)
    layer.state = states[0]
    return layer, states


def run_step(layer: GatedDeltaNet, requests: list[tuple[int, torch.Tensor, bool, int]]):
    """One step: per request (slot, its tokens' inputs [n, hidden], has_initial_state,
    spec_len). Returns each request's outputs."""
    x = torch.cat([t for _, t, _, _ in requests])
    lens = [t.shape[0] for _, t, _, _ in requests]
    starts = [0]
    for n in lens:
        starts.append(starts[-1] + n)
    meta = RecurrentMetadata(
        state_slots=torch.tensor([s for s, _, _, _ in requests]),
        query_start_loc=starts,
        query_lens=lens,
        has_initial_state=torch.tensor([h for _, _, h, _ in requests]),
        spec_lens=[q for _, _, _, q in requests],
    )
    with torch.no_grad(), forward_context(SimpleNamespace(recurrent=meta)):
        out = layer(x, torch.zeros_like(x))
    return list(out.split(lens))


def state_of(states, slot: int) -> list[torch.Tensor]:
    return [t[slot].clone() for t in states[0].tensors]


def hidden_inputs(length: int, seed: int) -> torch.Tensor:
    return torch.randn(length, 64, generator=torch.Generator().manual_seed(seed), dtype=F64)


def test_layer_gives_one_pass_results_for_any_split_into_steps():
    layer, states = make_layer()
    a, b, c = hidden_inputs(30, 1), hidden_inputs(20, 2), hidden_inputs(3, 3)
    ref = {}
    for slot, x in ((0, a), (1, b), (2, c)):
        out = run_step(layer, [(slot, x, False, 0)])[0]
        ref[slot] = (out, state_of(states, slot))
    for t in states[0].tensors:  # stale state in every slot: fresh requests must ignore it
        t.normal_()
    a_out, b_out, c_out = [], [], []
    # Step 1: a's first chunk, b's one-token start (fresh, through the decode path), c whole.
    o = run_step(layer, [(4, a[:11], False, 0), (3, b[:1], False, 0), (5, c, False, 0)])
    a_out.append(o[0]), b_out.append(o[1]), c_out.append(o[2])
    # Step 2: decodes of a and b together, then a prefill chunk of b.
    o = run_step(layer, [(3, b[1:2], True, 0), (4, a[11:12], True, 0)])
    b_out.append(o[0]), a_out.append(o[1])
    o = run_step(layer, [(4, a[12:30], True, 0), (3, b[2:20], True, 0)])
    a_out.append(o[0]), b_out.append(o[1])
    for slot, ref_slot, outs in ((4, 0, a_out), (3, 1, b_out), (5, 2, c_out)):
        torch.testing.assert_close(torch.cat(outs), ref[ref_slot][0], atol=1e-10, rtol=1e-10)
        for got, want in zip(state_of(states, slot), ref[ref_slot][1], strict=True):
            torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("accepted", [0, 1, 3])
def test_spec_row_scratch_commits_to_the_state_of_its_accepted_prefix(accepted):
    q = 4
    layer, states = make_layer(spec_positions=q)
    prompt, other, row = hidden_inputs(10, 4), hidden_inputs(6, 5), hidden_inputs(q, 6)
    run_step(layer, [(2, prompt, False, 0), (1, other[:5], False, 0)])
    # The verification row of slot 2 next to a decode and a fresh prompt.
    out = run_step(layer, [(1, other[5:], True, 0), (2, row, True, q), (0, other, False, 0)])[1]
    commit_accepted(states, torch.tensor([2]), torch.tensor([accepted]))
    # Reference: the prompt and the row's first accepted + 1 tokens, without speculation.
    reference, reference_states = make_layer()
    full = run_step(reference, [(0, torch.cat([prompt, row]), False, 0)])[0]
    run_step(reference, [(3, torch.cat([prompt, row[: accepted + 1]]), False, 0)])
    for got, want in zip(state_of(states, 2), state_of(reference_states, 3), strict=True):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    # The row's outputs are those of its tokens run normally.
    torch.testing.assert_close(out, full[-q:], atol=1e-12, rtol=1e-12)


# -- the engine against transformers --------------------------------------------------------------
def hf_model(path):
    return AutoModelForCausalLM.from_pretrained(
        path, dtype=F64, experts_implementation="eager"
    ).eval()


@contextmanager
def one_thread() -> Iterator[None]:
    """transformers' float64 depthwise conv1d is slow with several threads on a loaded
    machine (thread sync per tiny call); one thread gives the same numbers quickly."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def hf_greedy(model, prompt: list[int], steps: int) -> list[int]:
    with torch.no_grad(), one_thread():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=steps,
            min_new_tokens=steps,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module")
def reference(request):
    """Per checkpoint fixture name: the transformers model and its greedy tokens of PROMPTS."""
    cache: dict[str, tuple] = {}

    def get(arch: str):
        if arch not in cache:
            model = hf_model(request.getfixturevalue(arch))
            cache[arch] = (model, [hf_greedy(model, p, STEPS) for p in PROMPTS])
        return cache[arch]

    return get


def make_llm(path, **kwargs) -> LLM:
    llm = LLM(str(path), dtype="float64", **kwargs)
    llm.engine.core.executor.runner.model.set_chunk_size(CHUNK)
    return llm


def generate(llm: LLM, prompts: list[list[int]], steps: int) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=steps, min_tokens=steps)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def assert_all_released(llm: LLM) -> None:
    engine = llm.engine
    assert engine.num_free_kv_blocks() == engine.num_usable_kv_blocks()
    slots = engine.core.executor.runner.recurrent
    assert slots.num_used == 0 and slots.num_free == slots.num_slots


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_transformers_for_a_mixed_length_batch(arch, request, reference):
    llm = make_llm(
        request.getfixturevalue(arch), max_num_batched_tokens=512, async_scheduling=False
    )
    seen = capture_logits(llm)
    generate(llm, PROMPTS, 1)
    assert len(seen) == 1 and seen[0].shape[0] == len(PROMPTS)  # one step, all prompts together
    model, _ = reference(arch)
    with torch.no_grad(), one_thread():
        for i, prompt in enumerate(PROMPTS):
            ref = model(torch.tensor([prompt])).logits[0, -1]
            # transformers runs the norms and the delta rule in float32 even for float64.
            torch.testing.assert_close(seen[0][i].double(), ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("async_scheduling, backend", [(False, "inline"), (True, "thread")])
def test_greedy_tokens_match_transformers_for_64_steps(
    arch, async_scheduling, backend, request, reference
):
    llm = make_llm(
        request.getfixturevalue(arch), async_scheduling=async_scheduling, executor_backend=backend
    )
    assert generate(llm, PROMPTS, STEPS) == reference(arch)[1]
    assert_all_released(llm)


@pytest.mark.parametrize("arch", ARCHS)
def test_chunked_prefill_matches_transformers(arch, request, reference):
    llm = make_llm(
        request.getfixturevalue(arch),
        enable_chunked_prefill=True,
        max_num_batched_tokens=12,  # 50 = 4 x 12 + 2: chunks that cut our 8-token chunks
        max_model_len=128,
        async_scheduling=False,
    )
    runner = llm.engine.core.executor.runner
    scheduled: list[list[int]] = []
    execute = runner.execute_model

    def recording(so):
        scheduled.append(sorted(so.num_scheduled_tokens.values()))
        return execute(so)

    runner.execute_model = recording
    prompts = [LONG_PROMPT, PROMPTS[0]]
    model, _ = reference(arch)
    assert generate(llm, prompts, 16) == [hf_greedy(model, p, 16) for p in prompts]
    assert scheduled.count([12]) >= 4  # the long prompt took several steps
    assert_all_released(llm)


@pytest.mark.parametrize("arch", ARCHS)
def test_recompute_after_preemption_matches_transformers(arch, request, reference):
    llm = make_llm(
        request.getfixturevalue(arch),
        max_model_len=112,
        block_size=16,
        num_kv_blocks=8,
        async_scheduling=False,
    )
    assert generate(llm, PROMPTS, STEPS) == reference(arch)[1]
    assert llm.engine.core.scheduler.num_preemptions > 0
    assert_all_released(llm)
