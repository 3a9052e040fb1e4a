"""The Triton paged attention kernel against dense attention, on the GPU: decodes, fresh
prompts, later chunks and prefix-cache hits in one call; GQA groups that are not powers of
two; block sizes below and above a key tile; float32, float16 and bfloat16."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.gpu

# (context, query tokens) per sequence: decodes, a fresh prompt, chunks with context.
STEPS = [
    [(10, 1), (40, 1), (0, 1), (129, 1)],
    [(0, 7), (5, 1), (20, 9), (0, 1)],
    [(0, 300), (33, 1), (17, 64), (250, 130)],
]
SHAPES = [
    dict(heads=8, kv_heads=2, head_dim=64, block_size=16),
    dict(heads=14, kv_heads=2, head_dim=128, block_size=16),  # 7 query heads a KV head
    dict(heads=4, kv_heads=4, head_dim=16, block_size=4),  # the tiny test models
    dict(heads=9, kv_heads=3, head_dim=24, block_size=128),  # head_dim padded to 32
]
TOLERANCE = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _case(seqs, heads, kv_heads, head_dim, block_size, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    lens = [c + q for c, q in seqs]
    need = sum(-(-n // block_size) for n in lens)
    cache = torch.randn(2, kv_heads, need + 3, block_size, head_dim, generator=g)
    width = max(-(-n // block_size) for n in lens)
    table = torch.zeros(len(seqs), width, dtype=torch.int64)
    perm = torch.randperm(need + 2, generator=g) + 1  # scattered blocks, never block 0
    used = 0
    for i, n in enumerate(lens):
        k = -(-n // block_size)
        table[i, :k] = perm[used : used + k]
        used += k
    q = torch.randn(sum(q for _, q in seqs), heads, head_dim, generator=g)
    starts = torch.tensor([0] + [q for _, q in seqs]).cumsum(0)[:-1]
    return q, cache, table, starts, lens


def _dense(q, cache, table, starts, seqs, scale):
    out = torch.empty_like(q, dtype=torch.float64)
    for i, (ctx, ql) in enumerate(seqs):
        n = ctx + ql
        k = cache[0][:, table[i]].flatten(1, 2)[:, :n].double()
        v = cache[1][:, table[i]].flatten(1, 2)[:, :n].double()
        s = int(starts[i])
        query = q[s : s + ql].double().transpose(0, 1).unsqueeze(0)
        mask = torch.arange(n)[None] <= (ctx + torch.arange(ql))[:, None]
        o = F.scaled_dot_product_attention(
            query, k.unsqueeze(0), v.unsqueeze(0), attn_mask=mask, scale=scale, enable_gqa=True
        )
        out[s : s + ql] = o[0].transpose(0, 1)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "shape", SHAPES, ids=lambda s: "h{heads}kv{kv_heads}d{head_dim}b{block_size}".format(**s)
)
@pytest.mark.parametrize("seqs", STEPS, ids=["decodes", "mixed", "long-chunks"])
def test_kernel_matches_dense_attention(seqs, shape, dtype):
    from omnistage.layers.triton_attention import paged_attention

    q, cache, table, starts, lens = _case(seqs, dtype=dtype, **shape)
    ref = _dense(q.to(dtype), cache.to(dtype), table, starts, seqs, 0.125)
    dev = torch.device("cuda")
    out = paged_attention(
        q.to(dev, dtype),
        cache.to(dev, dtype),
        table.to(dev),
        starts.to(dev),
        torch.tensor([ql for _, ql in seqs], device=dev),
        torch.tensor(lens, device=dev),
        max(ql for _, ql in seqs),
        0.125,
    )
    assert out.dtype == dtype
    err = (out.double().cpu() - ref).abs().max().item()
    assert err < TOLERANCE[dtype], err


def test_backend_attends_a_step_as_the_torch_path_does():
    """`TritonAttention.attend` over a step's metadata (the sequence table it builds from the
    decodes and prefill chunks) equals the portable torch path on the same tensors."""
    from omnistage.layers import attention as A
    from omnistage.layers.cuda_attention import TritonAttention

    dev, bs, seqs = torch.device("cuda"), 16, STEPS[1]
    q, cache, table, starts, lens = _case(seqs, 8, 2, 32, bs, torch.float32)
    # Each token's own key and value, as the step wrote them into its slot.
    slots = [
        int(table[i, p // bs]) * bs + p % bs
        for i, (ctx, ql) in enumerate(seqs)
        for p in range(ctx, ctx + ql)
    ]
    flat = cache.view(2, 2, -1, 32)[:, :, slots].permute(0, 2, 1, 3)  # [2, T, kv_heads, d]
    decode = [i for i, (_, ql) in enumerate(seqs) if ql == 1]

    def meta():
        return A.AttentionMetadata(
            num_tokens=q.shape[0],
            slot_mapping=torch.tensor(slots, device=dev),
            decode_token_idx=starts[decode].to(dev),
            decode_block_table=table[decode].to(dev),
            decode_seq_lens=torch.tensor([lens[i] for i in decode], device=dev),
            prefills=[
                A.PrefillSeq(int(starts[i]), ql, ctx, table[i, : -(-(ctx + ql) // bs)].to(dev))
                for i, (ctx, ql) in enumerate(seqs)
                if ql > 1
            ],
            all_decode=False,
        )

    q, cache, k, v = q.to(dev), cache.to(dev), flat[0].to(dev), flat[1].to(dev)
    expected = A.attend(q, k, v, cache, meta(), 0.2)  # the portable backend
    triton_meta = meta()
    triton_meta.backend = TritonAttention()
    got = A.attend(q, k, v, cache, triton_meta, 0.2)
    assert "sequences" in triton_meta.backend_cache  # the kernel ran, not the torch path
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-5)
