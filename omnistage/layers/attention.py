"""Attention over the paged KV cache, in plain torch (the CPU backend).

Layout: one tensor per layer, `[2, kv_heads, num_blocks, block_size, head_dim]`
(keys, values), heads outermost, so gathering a request's blocks yields keys
already shaped `[kv_heads, tokens, head_dim]` as attention wants them (no
transpose copies). A token at position p of a request lives in slot
`block_table[p // block_size] * block_size + p % block_size`.

Each layer first writes the new keys and values of every token of the step
into their slots, then attends — so a request may read blocks another request
of the same step is filling (a prefix-cache hit on a block being computed).

The step's requests come in two groups (`AttentionMetadata`):
- decodes (one query token each) are attended together: their contexts are
  gathered into one padded tensor and attended with two batched GEMMs, the
  query heads that share a KV head acting as that head's query rows (GQA
  without broadcasting keys);
- prefills (several query tokens: a prompt or a chunk of it) are attended one
  request at a time; a prompt starting at position 0 attends to its own fresh
  keys with a causal mask, a later chunk gathers its earlier context.
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from omnistage import kernels
from omnistage.kernels import work_sharing
from omnistage.layers.recurrent_state import RecurrentMetadata

PARALLEL_DECODE_WORK = 16384
"""Context tokens x KV heads of a decode step from which its attention kernel runs on
several threads (below, waking a helper costs more than it saves)."""


@dataclass
class PrefillSeq:
    query_start: int
    query_len: int
    context_len: int
    """Tokens before this chunk (already in the cache)."""
    block_ids: torch.Tensor
    """Blocks covering context + chunk."""


@dataclass
class AttentionMetadata:
    num_tokens: int
    slot_mapping: torch.Tensor
    """[num_tokens] int64: the cache slot of each token of the step."""
    decode_token_idx: torch.Tensor | None
    """[num_decodes] int64: positions of decode tokens in the flat step."""
    decode_block_table: torch.Tensor | None
    """[num_decodes, max_blocks] int64 (padded with block 0)."""
    decode_mask: torch.Tensor | None
    """[num_decodes, max_blocks * block_size] bool: which gathered slots are real."""
    decode_seq_lens: torch.Tensor | None
    """[num_decodes] int64: context length of each decode, its new token included."""
    prefills: list[PrefillSeq]
    all_decode: bool
    decode_context_tokens: int = 0
    """Sum of `decode_seq_lens`: the decode attention's work."""
    _bias_cache: dict = field(default_factory=dict)
    recurrent: RecurrentMetadata | None = None
    """Models with recurrent layers: the step's state slots (worker/recurrent.py)."""

    def decode_bias(self, kv_heads: int, dtype: torch.dtype) -> torch.Tensor:
        """Additive mask [kv_heads * num_decodes, 1, L] (0 or -inf), built once per step."""
        key = (kv_heads, dtype)
        if key not in self._bias_cache:
            mask = self.decode_mask
            bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
            bias.masked_fill_(~mask, float("-inf"))
            self._bias_cache[key] = (
                bias.unsqueeze(0).expand(kv_heads, -1, -1).reshape(-1, 1, mask.shape[-1])
            )
        return self._bias_cache[key]


def allocate_kv_cache(
    num_blocks: int,
    block_size: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """A zeroed cache: padded slots are masked, and 0 * (masked garbage) must never be NaN.

    On CPU the zeros come from an anonymous `mmap`, so the OS hands out zero pages
    lazily: a 1 GiB cache costs nothing until blocks are written, where `torch.zeros`
    would touch every page at start-up (seconds on this machine). Not numpy's
    allocator: it advises huge pages for large arrays, and the first write into each
    2 MB region (one per layer, k/v and KV head) then waits for the kernel to find and
    zero a huge page: 0.25-0.4 s in a first step of SmolLM2 where 4 KB pages take
    0.01 s, with decode speed unchanged (measured at batch 1 and 32).
    """
    shape = (2, kv_heads, num_blocks, block_size, head_dim)
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    elem = torch.empty((), dtype=dtype).element_size()
    nbytes = elem * math.prod(shape)
    pages = mmap.mmap(-1, max(nbytes, 1))
    return torch.frombuffer(pages, dtype=torch.uint8, count=nbytes).view(dtype).view(shape)


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
    """Store the step's keys/values ([T, kv_heads, head_dim]) into their slots."""
    _, kv_heads, num_blocks, block_size, head_dim = kv_cache.shape
    flat = kv_cache.view(2, kv_heads, num_blocks * block_size, head_dim)
    flat[0].index_copy_(1, slots, k.transpose(0, 1))
    flat[1].index_copy_(1, slots, v.transpose(0, 1))


def rope_and_write_kv(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    heads: int,
) -> bool:
    """Rotate q and k in place inside `qkv` and write k, v to the cache with the C kernel.

    Returns False (having done nothing) where the kernel does not apply; the
    caller then rotates and calls `write_kv` itself.
    """
    if qkv.dtype != torch.float32 or qkv.device.type != "cpu" or not qkv.is_contiguous():
        return False
    lib = kernels.load()
    if lib is None:
        return False
    _, kv_heads, num_blocks, block_size, head_dim = kv_cache.shape
    lib.rope_write_kv_f32(
        qkv.data_ptr(),
        qkv.shape[0],
        heads,
        kv_heads,
        head_dim,
        positions.data_ptr(),
        cos.data_ptr(),
        sin.data_ptr(),
        kv_cache.data_ptr(),
        num_blocks * block_size,
        meta.slot_mapping.data_ptr(),
        torch.get_num_threads(),
    )
    return True


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Attention of the step's queries over the cache, which already holds this step's keys.

    q: [T, heads, d]; k, v: [T, kv_heads, d] (this step's, used by fresh prompts). -> [T, heads, d].
    """
    if meta.all_decode:
        return _decode(q, kv_cache, meta, scale)
    out = torch.empty_like(q)
    if meta.decode_token_idx is not None:
        idx = meta.decode_token_idx
        out.index_copy_(0, idx, _decode(q.index_select(0, idx), kv_cache, meta, scale))
    for seq in meta.prefills:
        s, e = seq.query_start, seq.query_start + seq.query_len
        out[s:e] = _prefill(q[s:e], k[s:e], v[s:e], kv_cache, seq, scale)
    return out


def _gather(kv_cache: torch.Tensor, block_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of the blocks `block_ids` ([n] or [B, n]) -> [kv_heads, (B,) n * block_size, d].

    One `index_select` over the outermost dimension of the cache viewed as
    `[2 * kv_heads * num_blocks, block_size, d]` fetches keys and values of every
    head at once (selecting along an inner dimension is several times slower on CPU).
    """
    _, kv_heads, num_blocks, block_size, head_dim = kv_cache.shape
    flat_ids = block_ids.reshape(-1)
    offsets = torch.arange(2 * kv_heads, device=flat_ids.device).unsqueeze(1) * num_blocks
    rows = (offsets + flat_ids.unsqueeze(0)).reshape(-1)
    gathered = kv_cache.view(-1, block_size, head_dim).index_select(0, rows)
    shape = (2, kv_heads, *block_ids.shape[:-1], -1, head_dim)
    gathered = gathered.view(shape)
    return gathered[0], gathered[1]


def _decode(
    q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    """One query token per request: the C kernel reads the blocks in place where it can."""
    if q.dtype == torch.float32 and q.device.type == "cpu":
        lib = kernels.load()
        _, kv_heads, _, block_size, head_dim = kv_cache.shape
        if lib is not None and lib.paged_decode_limits_ok(
            q.shape[1] // kv_heads, block_size, head_dim
        ):
            return _decode_kernel(lib, q, kv_cache, meta, scale)
    return _decode_torch(q, kv_cache, meta, scale)


def _decode_kernel(
    lib: Any, q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    q = q.contiguous()
    out = torch.empty_like(q)
    table = meta.decode_block_table
    _, kv_heads, num_blocks, block_size, head_dim = kv_cache.shape
    work_sharing.run(
        lib.paged_decode_attention_f32,
        lib.paged_decode_attention_f32_team,
        q.data_ptr(),
        kv_cache.data_ptr(),
        table.data_ptr(),
        meta.decode_seq_lens.data_ptr(),
        out.data_ptr(),
        q.shape[0],
        q.shape[1],
        kv_heads,
        head_dim,
        num_blocks,
        block_size,
        table.shape[1],
        scale,
        parallel=meta.decode_context_tokens * kv_heads >= PARALLEL_DECODE_WORK,
    )
    return out


def _decode_torch(
    q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    """Two batched GEMMs over [kv_heads * batch] small matrices of gathered keys and values."""
    keys, values = _gather(kv_cache, meta.decode_block_table)  # [kv_heads, B, L, d]
    kv_heads, batch, length, head_dim = keys.shape
    keys = keys.view(kv_heads * batch, length, head_dim)
    values = values.view(kv_heads * batch, length, head_dim)
    # [B, heads, d] -> [kv_heads * B, group, d]: the group of query heads of each KV head.
    grouped = (
        q.view(batch, kv_heads, -1, head_dim)
        .transpose(0, 1)
        .reshape(kv_heads * batch, -1, head_dim)
    )
    scores = torch.baddbmm(
        meta.decode_bias(kv_heads, q.dtype), grouped, keys.transpose(1, 2), alpha=scale
    )
    # At least float32 (bf16/fp16 models), but never less than the model's own precision:
    # a float64 model's decode must agree with its float64 prefill (recompute after a
    # preemption goes through prefill).
    softmax_dtype = torch.promote_types(scores.dtype, torch.float32)
    probs = torch.softmax(scores, dim=-1, dtype=softmax_dtype).to(values.dtype)
    out = torch.bmm(probs, values)  # [kv_heads * B, group, d]
    return out.view(kv_heads, batch, -1, head_dim).transpose(0, 1).reshape(q.shape)


def _prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    seq: PrefillSeq,
    scale: float,
) -> torch.Tensor:
    # 4-D [1, heads, L, d] inputs: torch's CPU kernels are several times faster than with 3-D.
    query = q.transpose(0, 1).unsqueeze(0)
    if seq.context_len == 0:
        keys, values = k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)
        out = F.scaled_dot_product_attention(
            query, keys, values, is_causal=True, scale=scale, enable_gqa=True
        )
        return out[0].transpose(0, 1)
    keys, values = _gather(kv_cache, seq.block_ids)  # [kv_heads, n * block_size, d]
    total = seq.context_len + seq.query_len
    keys, values = keys[:, :total].unsqueeze(0), values[:, :total].unsqueeze(0)
    q_pos = torch.arange(seq.context_len, total, device=q.device).unsqueeze(1)
    mask = torch.arange(total, device=q.device).unsqueeze(0) <= q_pos  # [q, total]
    out = F.scaled_dot_product_attention(
        query, keys, values, attn_mask=mask, scale=scale, enable_gqa=True
    )
    return out[0].transpose(0, 1)
