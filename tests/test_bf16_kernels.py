"""The bfloat16 variants of the CPU kernels (decode attention over a bfloat16 KV cache,
rotary + KV write, RMSNorm and Qwen3's q/k norm): each computes what its float32 variant
or transformers' bfloat16 arithmetic computes, and a bfloat16 model runs through them."""

from __future__ import annotations

import pytest
import torch

from omnistage import kernels
from omnistage.layers import attention as A
from omnistage.layers import cpu_attention
from omnistage.layers.norm import RMSNorm, qk_norm_in_place
from tests.test_attention import KERNEL_SHAPES, make_case

CPU = cpu_attention.CpuKernelAttention()


@pytest.fixture(scope="module")
def lib():
    lib = kernels.load()
    if lib is None:
        pytest.skip("no C compiler on this machine")
    return lib


@pytest.mark.parametrize("build", ["native", "no avx512"])
@pytest.mark.parametrize("shape", KERNEL_SHAPES)
def test_decode_over_a_bf16_cache_is_the_float32_walk_over_its_values(lib, build, shape):
    """Widening bfloat16 to float32 is exact, so the walk over a bfloat16 cache equals the
    float32 walk over the same values bit for bit, on the vector and the generic build."""
    if build != "native":
        lib = kernels.load_variant(("-mno-avx512f",))
    q, cache, meta = make_case(seed=7, **shape)
    cache16 = cache.bfloat16()
    out = cpu_attention.decode_kernel(lib, q, cache16, meta, 0.125, "bf16")
    assert torch.equal(out, cpu_attention.decode_kernel(lib, q, cache16.float(), meta, 0.125))


def test_the_backend_decodes_bf16_queries_through_float32(lib):
    q, cache, meta = make_case(seed=8, heads=9, kv_heads=3, head_dim=64)
    q16, cache16 = q.bfloat16(), cache.bfloat16()
    out = CPU.decode(q16, cache16, meta, 0.125)
    assert out is not None and out.dtype == torch.bfloat16
    expected = cpu_attention.decode_kernel(lib, q16.float(), cache16.float(), meta, 0.125)
    assert torch.equal(out, expected.bfloat16())
    # and it is attention: the torch path on the same bfloat16 tensors agrees to bf16 rounding
    torch.testing.assert_close(out, A._decode_torch(q16, cache16, meta, 0.125), atol=2e-2, rtol=0)


def test_rope_and_kv_write_round_the_float32_rotation_once(lib):
    heads, kv_heads, head_dim, tokens = 4, 2, 32, 5
    g = torch.Generator().manual_seed(9)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=g).bfloat16()
    angles = torch.rand(40, head_dim // 2, generator=g) * 6
    cos = torch.cat([angles.cos()] * 2, dim=1).bfloat16()
    sin = torch.cat([angles.sin()] * 2, dim=1).bfloat16()
    positions = torch.tensor([0, 3, 17, 39, 5])
    slots = torch.tensor([2, 9, 30, 31, 0])
    cache = A.allocate_kv_cache(4, 8, kv_heads, head_dim, torch.bfloat16, torch.device("cpu"), CPU)
    meta = make_case(batch=tokens, heads=heads, kv_heads=kv_heads, head_dim=head_dim)[2]
    meta.slot_mapping = slots
    before = qkv.clone()
    assert CPU.rope_and_write_kv(qkv, positions, cos, sin, cache, meta, heads)

    x = before.float().view(tokens, heads + 2 * kv_heads, head_dim)
    c, s = cos.float()[positions][:, None], sin.float()[positions][:, None]
    half = head_dim // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    expected = x * c + rotated * s
    expected[:, heads + kv_heads :] = x[:, heads + kv_heads :]  # v is not rotated
    got = qkv.view(tokens, heads + 2 * kv_heads, head_dim)
    # rounded once; where the compiler fused a product into an FMA, the float32 value may sit
    # one float32 step away, which moves a rounding at a bfloat16 midpoint by one step
    diff = (got.float() - expected.bfloat16().float()).abs()
    assert (diff <= expected.abs() * 2**-8).all()
    assert (got == expected.bfloat16()).float().mean() > 0.99
    flat = cache.view(2, kv_heads, -1, head_dim)
    assert torch.equal(flat[0][:, slots].transpose(0, 1), got[:, heads : heads + kv_heads])
    assert torch.equal(flat[1][:, slots].transpose(0, 1), got[:, heads + kv_heads :])


def _torch_rms_norm(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """transformers' arithmetic: normalised in float32, rounded, times the weight."""
    y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + norm.eps)
    return norm.weight * y.to(x.dtype)


def test_rms_norm_of_bf16_rows_is_transformers_arithmetic(lib):
    g = torch.Generator().manual_seed(10)
    norm = RMSNorm(576, 1e-5, torch.bfloat16)
    norm.weight.data = (torch.rand(576, generator=g) + 0.5).bfloat16()
    x = (torch.randn(33, 576, generator=g) * 3).bfloat16()
    out = norm(x)
    expected = _torch_rms_norm(norm, x)
    assert out.dtype == torch.bfloat16
    # one order of summing the squares against another: at most a bfloat16 step apart
    diff = (out.float() - expected.float()).abs()
    assert (diff <= expected.float().abs() * 2**-7).all()
    assert (out == expected).float().mean() > 0.95
    assert torch.equal(norm(x[5:6]), out[5:6])  # a row alone is the row in a batch


def test_qk_norm_of_bf16_heads_is_each_head_normalised(lib):
    heads, kv_heads, head_dim = 4, 2, 32
    g = torch.Generator().manual_seed(11)
    q_norm, k_norm = (
        RMSNorm(head_dim, 1e-6, torch.bfloat16),
        RMSNorm(head_dim, 1e-6, torch.bfloat16),
    )
    q_norm.weight.data = torch.rand(head_dim, generator=g).bfloat16()
    k_norm.weight.data = torch.rand(head_dim, generator=g).bfloat16()
    qkv = torch.randn(3, (heads + 2 * kv_heads) * head_dim, generator=g).bfloat16()
    rows = qkv.view(3, -1, head_dim)
    expected = torch.cat(
        [
            q_norm(rows[:, :heads]),
            k_norm(rows[:, heads : heads + kv_heads]),
            rows[:, heads + kv_heads :],
        ],
        dim=1,
    )
    assert qk_norm_in_place(qkv, q_norm, k_norm, heads, kv_heads)
    assert torch.equal(qkv.view(3, -1, head_dim), expected)


@pytest.mark.parametrize("checkpoint", ["tiny_llama", "tiny_qwen3"])
def test_a_bf16_model_on_the_kernels_decodes_what_float32_transformers_scores(checkpoint, request):
    """End to end in bfloat16 (Qwen3: q/k norm and rotary fused too): every decoded
    token's log-prob is transformers' float32 log-prob of that token after the same
    sequence, within bfloat16 rounding, and sync scheduling equals async exactly. (Greedy
    tokens themselves are not compared with another bfloat16 path: on random weights the
    top logits are near ties that any rounding flips.)"""
    from transformers import AutoModelForCausalLM

    from omnistage import LLM, SamplingParams

    model = str(request.getfixturevalue(checkpoint))
    prompts = [list(range(5, 5 + n)) for n in (3, 17, 40)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=1)

    def run(async_scheduling: bool):
        llm = LLM(model, dtype="bfloat16", async_scheduling=async_scheduling)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [o.outputs[0] for o in outs]

    outs = run(async_scheduling=True)
    assert [o.token_ids for o in run(async_scheduling=False)] == [o.token_ids for o in outs]
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    for prompt, out in zip(prompts, outs, strict=True):
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + out.token_ids])).logits[0]
        reference = torch.log_softmax(logits, dim=-1)[len(prompt) - 1 :]
        for i, token in enumerate(out.token_ids):
            assert abs(out.logprobs[i][token].logprob - reference[i, token].item()) < 0.1, i
