"""The CUDA platform's attention backend: a step's attention in one Triton kernel call.

Prefill chunks (fresh prompts, later chunks, prompts after a prefix-cache hit) and
decodes are attended together by `layers/triton_attention.py` over the paged cache,
for float16, bfloat16 and float32 tensors; float64 (the exact-equality test models)
takes the torch path of `layers/attention.py`, as does any CPU tensor. The step's
sequence table (each sequence's query tokens, key count and block-table row) is
built once per step, at its first attention layer, and kept in the step's metadata.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from omnistage.layers.attention import AttentionMetadata
from omnistage.layers.attention_backend import AttentionBackend


@dataclass
class SequenceTable:
    """The step's sequences as the kernel reads them (device tensors, one row each)."""

    block_table: torch.Tensor
    query_start: torch.Tensor
    query_len: torch.Tensor
    seq_len: torch.Tensor
    max_query_len: int


def sequence_table(meta: AttentionMetadata, device: torch.device) -> SequenceTable:
    """Decodes first (one query token each, their padded block table as it is), then the
    prefill chunks, their block lists (on the device) padded to the widest row with
    block 0."""
    decodes = 0 if meta.decode_token_idx is None else meta.decode_token_idx.shape[0]
    if not meta.prefills:
        ones = torch.ones(decodes, dtype=torch.int64, device=device)
        return SequenceTable(
            meta.decode_block_table, meta.decode_token_idx, ones, meta.decode_seq_lens, 1
        )
    rows = pad_sequence([p.block_ids for p in meta.prefills], batch_first=True)
    if decodes:
        width = max(rows.shape[1], meta.decode_block_table.shape[1])
        rows = F.pad(rows, (0, width - rows.shape[1]))
    lists = torch.tensor(
        [
            [p.query_start for p in meta.prefills],
            [p.query_len for p in meta.prefills],
            [p.context_len + p.query_len for p in meta.prefills],
        ],
        dtype=torch.int64,
    ).to(device, non_blocking=True)
    max_query_len = max(p.query_len for p in meta.prefills)
    if not decodes:
        return SequenceTable(rows, lists[0], lists[1], lists[2], max_query_len)
    table = F.pad(meta.decode_block_table, (0, rows.shape[1] - meta.decode_block_table.shape[1]))
    ones = torch.ones(decodes, dtype=torch.int64, device=device)
    return SequenceTable(
        torch.cat([table, rows]),
        torch.cat([meta.decode_token_idx, lists[0]]),
        torch.cat([ones, lists[1]]),
        torch.cat([meta.decode_seq_lens, lists[2]]),
        max_query_len,
    )


class TritonAttention(AttentionBackend):
    """Attention of a whole step in one kernel call per layer (`layers/triton_attention.py`)."""

    name = "triton"

    def __init__(self) -> None:
        from omnistage.layers import triton_attention  # imports Triton: only where it runs

        self._kernel = triton_attention

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor | None:
        if q.dtype not in self._kernel.SUPPORTED_DTYPES:
            return None
        table = meta.backend_cache.get("sequences")
        if table is None:
            table = meta.backend_cache["sequences"] = sequence_table(meta, q.device)
        return self._kernel.paged_attention(
            q if q.stride(-1) == 1 else q.contiguous(),
            kv_cache,
            table.block_table,
            table.query_start,
            table.query_len,
            table.seq_len,
            table.max_query_len,
            scale,
        )
