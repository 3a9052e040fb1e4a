"""Attention over the paged KV cache: the interface models call, and its torch paths.

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

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from omnistage.layers.attention_backend import TORCH_ATTENTION, AttentionBackend
from omnistage.layers.recurrent_state import RecurrentMetadata


@dataclass
class PrefillSeq:
    query_start: int
    query_len: int
    context_len: int
    """Tokens before this chunk (already in the cache)."""
    block_ids: torch.Tensor
    """Blocks covering context + chunk (on the step's device)."""


@dataclass
class AttentionMetadata:
    num_tokens: int
    slot_mapping: torch.Tensor
    """[num_tokens] int64: the cache slot of each token of the step."""
    decode_token_idx: torch.Tensor | None
    """[num_decodes] int64: positions of decode tokens in the flat step."""
    decode_block_table: torch.Tensor | None
    """[num_decodes, max_blocks] int64 (padded with block 0)."""
    decode_seq_lens: torch.Tensor | None
    """[num_decodes] int64: context length of each decode, its new token included."""
    prefills: list[PrefillSeq]
    all_decode: bool
    decode_context_tokens: int = 0
    """Sum of `decode_seq_lens`: the decode attention's work."""
    backend_cache: dict = field(default_factory=dict)
    """What attention derives from this metadata once per step (at its first layer) and
    every later layer reuses: the torch path's decode mask, the CUDA backend's sequence
    table."""
    recurrent: RecurrentMetadata | None = None
    """Models with recurrent layers: the step's state slots (worker/recurrent.py)."""
    backend: AttentionBackend = TORCH_ATTENTION
    """The platform's attention backend (`layers/attention_backend.py`)."""
    token_modality: torch.Tensor | None = None
    """Models with `token_modalities`: [num_tokens] int64 modality code of each token of the
    step (0 text; `core/multimodal_inputs.py`); None when every token is text."""

    def decode_bias(self, kv_heads: int, dtype: torch.dtype, length: int) -> torch.Tensor:
        """Additive mask [kv_heads * num_decodes, 1, length] (0 or -inf: which of the
        `length` gathered slots of each decode are real), built once per step, and only by
        the torch path (a kernel reads `decode_seq_lens`)."""
        key = ("decode_bias", kv_heads, dtype)
        if key not in self.backend_cache:
            lens = self.decode_seq_lens
            mask = torch.arange(length, device=lens.device).unsqueeze(0) < lens.unsqueeze(1)
            bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
            bias.masked_fill_(~mask, float("-inf"))
            self.backend_cache[key] = (
                bias.unsqueeze(0).expand(kv_heads, -1, -1).reshape(-1, 1, mask.shape[-1])
            )
        return self.backend_cache[key]


def allocate_kv_cache(
    num_blocks: int,
    block_size: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    backend: AttentionBackend = TORCH_ATTENTION,
) -> torch.Tensor:
    """A zeroed cache in this module's layout, allocated as the platform's backend does."""
    return backend.allocate_kv_cache((2, kv_heads, num_blocks, block_size, head_dim), dtype, device)


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
    """Rotate q and k in place inside `qkv` and write k, v to the cache in one call of the
    platform's backend. Returns False (having done nothing) where the backend has none;
    the caller then rotates and calls `write_kv` itself."""
    return meta.backend.rope_and_write_kv(qkv, positions, cos, sin, kv_cache, meta, heads)


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
    The platform's backend attends the whole step where it can (CUDA), else the torch
    paths below run, with the backend's decode kernel where it has one (CPU).
    """
    out = meta.backend.attend(q, k, v, kv_cache, meta, scale)
    if out is not None:
        return out
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
    """One query token per request: the platform's backend where it has a kernel, else
    the torch path."""
    out = meta.backend.decode(q, kv_cache, meta, scale)
    return out if out is not None else _decode_torch(q, kv_cache, meta, scale)


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
        meta.decode_bias(kv_heads, q.dtype, length), grouped, keys.transpose(1, 2), alpha=scale
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
