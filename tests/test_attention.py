"""Paged attention: the C decode kernel, the torch decode path and a dense reference agree."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from omnistage import kernels
from omnistage.kernels import work_sharing
from omnistage.layers import attention as A
from omnistage.layers import cpu_attention

CPU = cpu_attention.CpuKernelAttention()

KERNEL_SHAPES = [
    dict(heads=8, kv_heads=2),
    dict(heads=9, kv_heads=3, head_dim=64),
    dict(heads=4, kv_heads=4),
    dict(heads=4, kv_heads=2, head_dim=16),  # the tiny test models
    dict(heads=6, kv_heads=2, head_dim=32, block_size=32),  # 16-token chunks of a block
    dict(heads=4, kv_heads=1, head_dim=24, block_size=8),  # no vector fast path
    dict(heads=14, kv_heads=2, head_dim=128),  # values in tiles of 4 + 3 heads, 2 x 64 wide
    dict(heads=16, kv_heads=1, head_dim=80),  # 16 heads a KV head; a 64- and a 16-wide tile
]


def make_case(batch=7, heads=8, kv_heads=2, head_dim=32, block_size=16, num_blocks=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    cache = torch.randn(2, kv_heads, num_blocks, block_size, head_dim, generator=g)
    seq_lens = torch.randint(1, 90, (batch,), generator=g)
    max_blocks = int((seq_lens.max() + block_size - 1) // block_size)
    table = torch.zeros(batch, max_blocks, dtype=torch.long)
    for b in range(batch):  # scattered, distinct blocks per sequence
        n = int((seq_lens[b] + block_size - 1) // block_size)
        table[b, :n] = torch.randperm(num_blocks - 1, generator=g)[:n] + 1
    meta = A.AttentionMetadata(
        num_tokens=batch,
        slot_mapping=torch.zeros(batch, dtype=torch.long),
        decode_token_idx=None,
        decode_block_table=table,
        decode_seq_lens=seq_lens,
        prefills=[],
        all_decode=True,
        decode_context_tokens=int(seq_lens.sum()),
    )
    q = torch.randn(batch, heads, head_dim, generator=g)
    return q, cache, meta


def dense_reference(q, cache, meta, scale):
    out = []
    for b in range(q.shape[0]):
        n = int(meta.decode_seq_lens[b])
        ids = meta.decode_block_table[b]
        k = cache[0][:, ids].flatten(1, 2)[:, :n]  # [kv_heads, n, d]
        v = cache[1][:, ids].flatten(1, 2)[:, :n]
        o = F.scaled_dot_product_attention(q[b].unsqueeze(1), k, v, scale=scale, enable_gqa=True)
        out.append(o.squeeze(1))
    return torch.stack(out)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_torch_decode_matches_dense_reference(seed):
    q, cache, meta = make_case(seed=seed)
    torch.testing.assert_close(
        A._decode_torch(q, cache, meta, 0.17), dense_reference(q, cache, meta, 0.17)
    )


def test_float64_decode_keeps_float64_precision():
    """A float64 model's decode agrees with dense float64 attention to rounding: its
    softmax is not computed in float32 (a preempted request, recomputed through prefill,
    must get what an uninterrupted one gets)."""
    q, cache, meta = make_case(seed=3)
    q, cache = q.double(), cache.double()
    out = A._decode_torch(q, cache, meta, 0.17)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, dense_reference(q, cache, meta, 0.17), rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("shape", KERNEL_SHAPES)
def test_c_kernel_matches_dense_reference(seed, shape):
    lib = kernels.load()
    if lib is None:
        pytest.skip("no C compiler on this machine")
    q, cache, meta = make_case(seed=seed, **shape)
    out = cpu_attention.decode_kernel(lib, q, cache, meta, 0.125)
    torch.testing.assert_close(out, dense_reference(q, cache, meta, 0.125), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("shape", KERNEL_SHAPES)
def test_c_kernel_generic_loops_match_dense_reference(shape):
    """The kernel built without the AVX-512 paths (what a CPU without them runs)."""
    lib = kernels.load_variant(("-mno-avx512f",))
    if lib is None:
        pytest.skip("no C compiler on this machine")
    q, cache, meta = make_case(seed=4, **shape)
    out = cpu_attention.decode_kernel(lib, q, cache, meta, 0.125)
    torch.testing.assert_close(out, dense_reference(q, cache, meta, 0.125), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("torch_threads", [1, 3])
def test_c_kernel_shares_work_between_threads(monkeypatch, torch_threads):
    """Several threads taking units from one counter compute every unit exactly once:
    the result equals the single-threaded call bit for bit — on helper threads (torch
    on one thread) and on torch's OpenMP team (several)."""
    lib = kernels.load()
    if lib is None:
        pytest.skip("no C compiler on this machine")
    q, cache, meta = make_case(batch=97, seed=5)
    alone = cpu_attention.decode_kernel(lib, q, cache, meta, 0.125)
    monkeypatch.setattr(cpu_attention, "PARALLEL_DECODE_WORK", 0)
    before = torch.get_num_threads()
    torch.set_num_threads(torch_threads)
    work_sharing.set_num_threads(4)
    try:
        for _ in range(20):
            assert torch.equal(cpu_attention.decode_kernel(lib, q, cache, meta, 0.125), alone)
    finally:
        torch.set_num_threads(before)
        work_sharing.set_num_threads(work_sharing.available_cores())


def test_small_models_compute_on_one_torch_thread():
    """Default threads: a model narrower than SMALL_HIDDEN_SIZE gets one torch thread
    (the kernels keep every core); a wide one, or an explicit `num_threads`, does not."""
    from omnistage.platforms import interface
    from omnistage.platforms.interface import SMALL_HIDDEN_SIZE, Platform

    platform, before = Platform(), torch.get_num_threads()
    try:
        platform.configure_threads(None, hidden_size=64)
        assert torch.get_num_threads() == 1
        assert work_sharing.num_threads() == work_sharing.available_cores()
        platform.configure_threads(3, hidden_size=64)
        assert torch.get_num_threads() == 3 and work_sharing.num_threads() == 3
        platform.configure_threads(None, hidden_size=SMALL_HIDDEN_SIZE)
        assert torch.get_num_threads() == interface._TORCH_DEFAULT_THREADS
    finally:
        torch.set_num_threads(before)
        work_sharing.set_num_threads(work_sharing.available_cores())


def test_engine_tokens_same_with_and_without_c_kernels(tiny_llama, monkeypatch):
    from omnistage import LLM, SamplingParams

    prompts = [{"prompt_token_ids": list(range(5, 5 + n))} for n in (3, 17, 40)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    with_kernels = [
        o.outputs[0].token_ids
        for o in LLM(str(tiny_llama)).generate(prompts, params, use_tqdm=False)
    ]
    monkeypatch.setattr(kernels, "load", lambda: None)
    torch_only = [
        o.outputs[0].token_ids
        for o in LLM(str(tiny_llama)).generate(prompts, params, use_tqdm=False)
    ]
    assert with_kernels == torch_only


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_a_cpu_kv_cache_is_zeroed_writable_and_its_own(dtype):
    a = A.allocate_kv_cache(64, 16, 2, 8, dtype, torch.device("cpu"), CPU)
    b = A.allocate_kv_cache(64, 16, 2, 8, dtype, torch.device("cpu"), CPU)
    assert a.shape == (2, 2, 64, 16, 8) and a.dtype == dtype and a.is_contiguous()
    assert not a.any()
    a[1, 1, 63, 15] = 3.0
    assert a[1, 1, 63, 15].eq(3.0).all() and not b.any()


def test_the_platform_chooses_the_backend_models_attend_through(monkeypatch):
    """Models call `attend`; the step's metadata carries the platform's backend: the CPU
    platform's runs the C kernel, the portable one (other platforms) torch, same answer."""
    from omnistage.platforms import platform_for

    assert platform_for("cpu").attention_backend.name == "cpu"
    lib = kernels.load()
    if lib is None:
        pytest.skip("no C compiler on this machine")
    q, cache, meta = make_case(seed=5)
    kernel_calls = []
    real = cpu_attention.decode_kernel
    monkeypatch.setattr(
        cpu_attention, "decode_kernel", lambda *a: kernel_calls.append(1) or real(*a)
    )
    meta.backend = platform_for("cpu").attention_backend
    on_cpu = A.attend(q, q, q, cache, meta, 0.125)
    assert kernel_calls == [1]
    meta.backend = A.TORCH_ATTENTION
    portable = A.attend(q, q, q, cache, meta, 0.125)
    assert kernel_calls == [1]
    torch.testing.assert_close(on_cpu, portable, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "shape", [dict(heads=9, kv_heads=3, head_dim=64), dict(heads=4, kv_heads=1)]
)
def test_c_kernel_row_alone_equals_row_in_a_batch(monkeypatch, shape):
    """The kernel's units change with the batch (one sequence of one KV head: a unit per
    query head; few (sequence, KV head) pairs: taken one at a time; many: four at a time),
    and a sequence's output does not: alone, shared by threads, or in a batch of 40, bit
    for bit."""
    lib = kernels.load()
    if lib is None:
        pytest.skip("no C compiler on this machine")
    q, cache, meta = make_case(batch=40, seed=6, **shape)
    batched = cpu_attention.decode_kernel(lib, q, cache, meta, 0.125)
    monkeypatch.setattr(cpu_attention, "PARALLEL_DECODE_WORK", 0)  # threads share even one row
    work_sharing.set_num_threads(3)
    try:
        for b in (0, 17, 39):
            lens = meta.decode_seq_lens[b : b + 1]
            table = meta.decode_block_table[b : b + 1]
            one = A.AttentionMetadata(
                num_tokens=1,
                slot_mapping=torch.zeros(1, dtype=torch.long),
                decode_token_idx=None,
                decode_block_table=table,
                decode_seq_lens=lens,
                prefills=[],
                all_decode=True,
                decode_context_tokens=int(lens.sum()),
            )
            alone = cpu_attention.decode_kernel(lib, q[b : b + 1], cache, one, 0.125)
            assert torch.equal(alone[0], batched[b])
    finally:
        work_sharing.set_num_threads(work_sharing.available_cores())
