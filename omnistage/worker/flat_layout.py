"""`build_flat_layout`: where each token of a forward pass sits, and its attention metadata.

A pass computes `n[i]` tokens of batch row `rows[i]` from position `start[i]`,
rows one after another in a flat token order. Each token gets its position and
its KV cache slot (from the row's block table); rows with one token are
decodes, attended together, the others prefill chunks (or verification rows),
attended one by one (layers/attention.py). The runner's step and the draft
model / MTP passes over the same blocks all build their layout here, and a
pass runs inside `layout.forward_context()`.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass

import numpy as np
import torch

from omnistage.layers.attention import AttentionMetadata, PrefillSeq
from omnistage.layers.forward_context import forward_context


@dataclass
class FlatLayout:
    """Where each token of a pass sits: its row, its position, its cache slot (attention)."""

    tok_rows: np.ndarray
    positions: np.ndarray
    first: np.ndarray
    """Flat index of each row's first token."""
    ends: np.ndarray
    """Flat index one past each row's last token."""
    attn: AttentionMetadata

    def forward_context(self) -> AbstractContextManager[None]:
        """The forward context of this pass: a model called inside it attends as laid out
        (how a proposer runs its passes without importing the worker)."""
        return forward_context(self.attn)


def build_flat_layout(
    block_table: np.ndarray,
    block_size: int,
    device: torch.device,
    rows: np.ndarray,
    start: np.ndarray,
    n: np.ndarray,
) -> FlatLayout:
    """The layout of `n[i]` tokens of each row `rows[i]` from position `start[i]`."""
    if int(n.max()) == 1:
        return _decode_layout(block_table, block_size, device, rows, start)
    bs = block_size
    ends = np.cumsum(n)
    first = ends - n  # flat index of each row's first token
    tok_rows = np.repeat(rows, n)
    pos = np.repeat(start - first, n) + np.arange(int(ends[-1]))
    slots = block_table[tok_rows, pos // bs] * bs + pos % bs
    decode = n == 1
    prefills = [
        PrefillSeq(
            int(f),
            int(k),
            int(c),
            torch.from_numpy(block_table[r, : -(-(c + k) // bs)].copy()).to(device),
        )
        for r, f, k, c in zip(
            rows[~decode], first[~decode], n[~decode], start[~decode], strict=True
        )
    ]
    attn = _attention_metadata(
        block_table,
        block_size,
        device,
        int(ends[-1]),
        slots,
        rows[decode],
        start[decode] + 1,
        first[decode],
        prefills,
    )
    return FlatLayout(tok_rows, pos, first, ends, attn)


def _decode_layout(
    block_table: np.ndarray,
    block_size: int,
    device: torch.device,
    rows: np.ndarray,
    start: np.ndarray,
) -> FlatLayout:
    """`build_flat_layout` when every row computes one token (a decode step): token `i` is
    row `rows[i]` at position `start[i]`, without the general case's repeats, sums and
    prefill split (the same layout, fewer numpy calls a step)."""
    first = np.arange(len(rows))
    slots = block_table[rows, start // block_size] * block_size + start % block_size
    attn = _attention_metadata(
        block_table, block_size, device, len(rows), slots, rows, start + 1, first, []
    )
    return FlatLayout(rows, start, first, first + 1, attn)


def _attention_metadata(
    block_table: np.ndarray,
    block_size: int,
    device: torch.device,
    num_tokens: int,
    slots: np.ndarray,
    decode_rows: np.ndarray,
    decode_seq_lens: np.ndarray,
    decode_idx: np.ndarray,
    prefills: list[PrefillSeq],
) -> AttentionMetadata:
    bt = idx = lens = None
    if len(decode_rows):
        nblk = int(-(-decode_seq_lens.max() // block_size))
        bt = torch.from_numpy(block_table[decode_rows, :nblk]).to(device)
        lens = torch.from_numpy(decode_seq_lens).to(device)
        idx = torch.from_numpy(decode_idx).to(device)
    return AttentionMetadata(
        num_tokens=num_tokens,
        slot_mapping=torch.from_numpy(slots).to(device),
        decode_token_idx=idx,
        decode_block_table=bt,
        decode_seq_lens=lens,
        decode_context_tokens=int(decode_seq_lens.sum()) if len(decode_rows) else 0,
        prefills=prefills,
        all_decode=not prefills,
    )
