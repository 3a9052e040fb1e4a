"""`build_flat_layout`: a decode step's lean path lays tokens out as the general path does."""

from __future__ import annotations

import numpy as np
import torch

from omnistage.worker import flat_layout


def _general(block_table, block_size, rows, start, n):
    """The same decodes through the general path: a prefill row of 2 tokens added last (the
    decode rows' tokens keep their places; compare their first entries)."""
    extra_row = block_table.shape[0] - 1
    return flat_layout.build_flat_layout(
        block_table,
        block_size,
        torch.device("cpu"),
        np.append(rows, extra_row),
        np.append(start, 5),
        np.append(n, 2),
    )


def test_a_decode_step_takes_the_lean_path_with_the_same_layout(monkeypatch):
    rng = np.random.default_rng(0)
    block_size, rows = 16, np.array([0, 2, 3, 6])
    block_table = rng.permutation(8 * 20).reshape(8, 20).astype(np.int64)
    start = np.array([0, 15, 16, 200])
    n = np.ones(len(rows), dtype=np.int64)
    lean = flat_layout.build_flat_layout(
        block_table, block_size, torch.device("cpu"), rows, start, n
    )
    full = _general(block_table, block_size, rows, start, n)
    d = len(rows)
    assert np.array_equal(lean.tok_rows, full.tok_rows[:d])
    assert np.array_equal(lean.positions, full.positions[:d])
    assert np.array_equal(lean.first, full.first[:d]) and np.array_equal(lean.ends, full.ends[:d])
    a, b = lean.attn, full.attn
    assert a.all_decode and not a.prefills and a.num_tokens == d
    assert torch.equal(a.slot_mapping, b.slot_mapping[:d])
    for name in ("decode_token_idx", "decode_block_table", "decode_seq_lens"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.decode_context_tokens == b.decode_context_tokens
    assert a.decode_seq_lens.tolist() == [1, 16, 17, 201]
    # the slot of position p of row r: block_table[r, p // 16] * 16 + p % 16
    assert a.slot_mapping.tolist() == [
        int(block_table[r, p // 16] * 16 + p % 16) for r, p in zip(rows, start, strict=True)
    ]
