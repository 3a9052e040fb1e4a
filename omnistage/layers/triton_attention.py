"""Paged attention in one Triton kernel: prefill chunks and decodes of a step together.

Each sequence of the step has `query_len` query tokens starting at flat index
`query_start` and `seq_len` keys in the paged cache (its context and, already
written, its own new keys); its query token `i` sits at position
`seq_len - query_len + i` and sees the keys at positions up to its own (causal).
A decode is a sequence with one query token; a fresh prompt one without context;
a later chunk of a prompt, or a prompt whose prefix was cached, one with both.

One program computes a tile of `BLOCK_Q` query tokens of one sequence for one KV
head, the `group` query heads sharing that KV head stacked as rows (GQA without
repeating keys), over the sequence's keys `TILE_N` at a time, gathered through
its block table (any block size), with an online softmax in float32. The cache
layout is `layers/attention.py`'s: `[2, kv_heads, num_blocks, block_size, head_dim]`.

The module imports Triton; the CUDA backend (`layers/cuda_attention.py`) loads it
only on a CUDA device. Tests run it on the CPU under Triton's interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _online_softmax_step(q, k, v, visible, m_i, l_i, acc, scale, PRECISION: tl.constexpr):
    """One tile of keys into the running maximum `m_i`, sum `l_i` and output `acc` of the
    query rows (`visible`: which key each row may see)."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that see nothing yet
    p = tl.exp(s - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def _paged_attention_kernel(
    q_ptr,
    out_ptr,
    cache_ptr,
    block_table_ptr,
    query_start_ptr,
    query_len_ptr,
    seq_len_ptr,
    scale,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_bt,
    kv_heads,
    num_blocks,
    block_size,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    TILE_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    tile = tl.program_id(1)
    kvh = tl.program_id(2)
    block_q: tl.constexpr = BLOCK_M // GROUP
    query_len = tl.load(query_len_ptr + seq)
    if tile * block_q >= query_len:
        return
    query_start = tl.load(query_start_ptr + seq)
    seq_len = tl.load(seq_len_ptr + seq)
    context = seq_len - query_len

    rows = tl.arange(0, BLOCK_M)
    token = tile * block_q + rows // GROUP  # query token of each row, within the sequence
    head = kvh * GROUP + rows % GROUP
    row_ok = (rows < block_q * GROUP) & (token < query_len)
    dims = tl.arange(0, HEAD_PAD)
    dim_ok = dims < HEAD_DIM
    q_off = (query_start + token)[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :]
    q = tl.load(q_ptr + q_off, mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    q_pos = context + token  # each row's position: it sees keys at positions <= q_pos

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)
    last = tl.minimum(seq_len, context + tile * block_q + block_q)  # keys this tile can see
    plane = num_blocks * block_size * HEAD_DIM  # one (k or v, kv head) plane of the cache
    k_base = cache_ptr + kvh * plane
    v_base = cache_ptr + (kv_heads + kvh) * plane
    for start in range(0, last, TILE_N):
        keys = start + tl.arange(0, TILE_N)
        key_ok = keys < last
        blk = tl.load(block_table_ptr + seq * stride_bt + keys // block_size, mask=key_ok, other=0)
        slot = blk.to(tl.int64) * block_size + keys % block_size
        kv_off = slot[:, None] * HEAD_DIM + dims[None, :]
        kv_mask = key_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_base + kv_off, mask=kv_mask, other=0.0)
        v = tl.load(v_base + kv_off, mask=kv_mask, other=0.0)
        visible = key_ok[None, :] & (keys[None, :] <= q_pos[:, None])
        m_i, l_i, acc = _online_softmax_step(q, k, v, visible, m_i, l_i, acc, scale, PRECISION)
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    o_off = (query_start + token)[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :]
    tl.store(
        out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :]
    )


SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
"""Dtypes the kernel computes in (float64 takes the torch path)."""


def paged_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    query_start: torch.Tensor,
    query_len: torch.Tensor,
    seq_len: torch.Tensor,
    max_query_len: int,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of `q` ([T, heads, head_dim]) over the paged cache for the step's sequences.

    block_table: [S, max_blocks]; query_start / query_len / seq_len: [S] (flat index of a
    sequence's first query token, its query tokens, its keys in the cache including this
    step's). `max_query_len` sizes the grid (1 for a step of decodes). Rows of `q` that
    belong to no sequence are left as `out` holds them.
    """
    tokens, heads, head_dim = q.shape
    _, kv_heads, num_blocks, block_size, _ = kv_cache.shape
    group = heads // kv_heads
    if out is None:
        out = torch.empty_like(q)
    block_m = max(16, triton.next_power_of_2(group))
    if max_query_len > 1:
        block_m = max(block_m, min(128, triton.next_power_of_2(group * max_query_len)))
    block_q = block_m // group
    grid = (seq_len.shape[0], triton.cdiv(max_query_len, block_q), kv_heads)
    _paged_attention_kernel[grid](
        q,
        out,
        kv_cache,
        block_table,
        query_start,
        query_len,
        seq_len,
        scale,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        block_table.stride(0),
        kv_heads,
        num_blocks,
        block_size,
        GROUP=group,
        HEAD_DIM=head_dim,
        HEAD_PAD=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_M=block_m,
        TILE_N=64 if max_query_len > 1 else 32,
        # float32 products in full precision (not TF32): the torch path's tokens, and the
        # equality tests', hold; half-precision inputs take the tensor cores as they are.
        PRECISION="ieee" if q.dtype == torch.float32 else None,
    )
    return out
