"""Attention over the paged KV cache, in plain torch (the CPU backend).

Layout: one tensor per layer, `[2, num_blocks, block_size, num_kv_heads, head_dim]`
(keys, values). A token at position p of a request lives in slot
`block_table[p // block_size] * block_size + p % block_size`.

Each layer first writes the new keys and values of every token of the step
into their slots, then attends — so a request may read blocks another request
of the same step is filling (a prefix-cache hit on a block being computed).

The step's requests come in two groups (`AttentionMetadata`):
- decodes (one query token each) are attended in one batched call over their
  gathered, padded context;
- prefills (several query tokens: a prompt or a chunk of it) are attended one
  request at a time; a prompt starting at position 0 attends to its own fresh
  keys with a causal mask, a later chunk gathers its earlier context from the
  cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


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
    """[num_decodes, 1, 1, max_blocks * block_size] bool: which gathered slots are real."""
    prefills: list[PrefillSeq]
    all_decode: bool


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
    """Store the step's keys/values ([T, kv_heads, head_dim]) into their slots."""
    num_blocks, block_size = kv_cache.shape[1], kv_cache.shape[2]
    flat = kv_cache.view(2, num_blocks * block_size, *kv_cache.shape[3:])
    flat[0].index_copy_(0, slots, k)
    flat[1].index_copy_(0, slots, v)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """q: [T, heads, d]; k, v: [T, kv_heads, d] (this step's). Returns [T, heads, d]."""
    write_kv(kv_cache, k, v, meta.slot_mapping)
    if meta.all_decode:
        return _decode(q, kv_cache, meta, scale)
    out = torch.empty_like(q)
    if meta.decode_token_idx is not None:
        out.index_copy_(
            0, meta.decode_token_idx, _decode(q[meta.decode_token_idx], kv_cache, meta, scale)
        )
    for seq in meta.prefills:
        s, e = seq.query_start, seq.query_start + seq.query_len
        out[s:e] = _prefill(q[s:e], k[s:e], v[s:e], kv_cache, seq, scale)
    return out


def _gather(kv_cache: torch.Tensor, block_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of the given blocks, flattened: [..., n_blocks * block_size, kv_heads, d]."""
    keys = kv_cache[0][block_ids]
    values = kv_cache[1][block_ids]
    shape = (*block_ids.shape[:-1], -1, *kv_cache.shape[3:])
    return keys.reshape(shape), values.reshape(shape)


def _decode(
    q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    keys, values = _gather(kv_cache, meta.decode_block_table)  # [B, L, kvh, d]
    out = F.scaled_dot_product_attention(
        q.unsqueeze(2),  # [B, heads, 1, d]
        keys.transpose(1, 2),
        values.transpose(1, 2),
        attn_mask=meta.decode_mask,
        scale=scale,
        enable_gqa=True,
    )
    return out.squeeze(2)


def _prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    seq: PrefillSeq,
    scale: float,
) -> torch.Tensor:
    # 4-D [1, heads, L, d] inputs: torch's CPU kernels are several times faster than with 3-D.
    if seq.context_len == 0:
        out = F.scaled_dot_product_attention(
            _heads_first(q),
            _heads_first(k),
            _heads_first(v),
            is_causal=True,
            scale=scale,
            enable_gqa=True,
        )
        return out[0].transpose(0, 1)
    keys, values = _gather(kv_cache, seq.block_ids)
    total = seq.context_len + seq.query_len
    keys, values = keys[:total], values[:total]
    q_pos = torch.arange(seq.context_len, total, device=q.device).unsqueeze(1)
    mask = torch.arange(total, device=q.device).unsqueeze(0) <= q_pos  # [q, total]
    out = F.scaled_dot_product_attention(
        _heads_first(q),
        _heads_first(keys),
        _heads_first(values),
        attn_mask=mask,
        scale=scale,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1)


def _heads_first(x: torch.Tensor) -> torch.Tensor:
    """[L, heads, d] -> [1, heads, L, d]."""
    return x.transpose(0, 1).unsqueeze(0)
