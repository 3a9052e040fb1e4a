"""The host-side plans of the CUDA path, checked on the CPU (the kernels and graphs
themselves run in tests/gpu): which steps a decode graph replays and how a step's inputs
fill its static buffers, the captured batch sizes, and the sequence table the Triton
attention reads (decodes first, then prefill chunks padded with block 0)."""

from __future__ import annotations

import numpy as np
import torch

from omnistage.layers.attention_backend import TORCH_ATTENTION
from omnistage.layers.cuda_attention import sequence_table
from omnistage.platforms.cuda_graphs import DecodeGraphs, capture_sizes
from omnistage.worker.flat_layout import build_flat_layout
from omnistage.worker.step_inputs import StepInputs

BLOCK_SIZE = 4
TABLE = np.array([[1, 2, 3, 0], [4, 5, 0, 0], [6, 7, 8, 9]], dtype=np.int64)


def step(start, n, drafts=None) -> StepInputs:
    rows = np.arange(len(start))
    start, n = np.asarray(start), np.asarray(n)
    layout = build_flat_layout(TABLE, BLOCK_SIZE, torch.device("cpu"), rows, start, n)
    tokens = int(n.sum())
    return StepInputs(
        input_ids=torch.arange(10, 10 + tokens),
        positions=torch.from_numpy(layout.positions),
        attn=layout.attn,
        rows=rows.tolist(),
        row_counts=n.tolist(),
        sample_rows=rows.tolist(),
        logits_indices=torch.from_numpy(layout.ends - 1),
        drafts=drafts or {},
        sample_outputs_before=[0] * len(rows),
    )


def graphs(max_num_seqs=8) -> DecodeGraphs:
    return DecodeGraphs(max_num_seqs, TABLE.shape[1], torch.device("cpu"), TORCH_ATTENTION)


def test_capture_sizes_end_at_max_num_seqs_and_stop_at_512():
    assert capture_sizes(1) == [1]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert capture_sizes(256)[-3:] == [192, 224, 256]
    assert capture_sizes(4096)[-1] == 512


def test_only_plain_decode_steps_replay():
    g = graphs()
    decode = step([5, 2, 9], [1, 1, 1])
    assert g._replayable(decode, None, None)
    assert not g._replayable(step([5, 0, 9], [1, 3, 1]), None, None)  # a prefill chunk
    assert not g._replayable(step([5, 2, 9], [1, 1, 1], {0: [7]}), None, None)  # drafts
    assert not g._replayable(decode, torch.zeros(3, 8), None)  # input embeddings
    assert not graphs(max_num_seqs=2)._replayable(decode, None, None)  # above the largest


def test_a_step_fills_the_buffers_and_padded_rows_decode_into_the_null_block():
    g = graphs()
    g.input_ids.fill_(99)
    g.slots.fill_(99)
    g.seq_lens.fill_(99)
    inputs = step([5, 2, 9], [1, 1, 1])
    g._load(inputs, 3, 4)
    assert g.input_ids[:4].tolist() == [10, 11, 12, 0]
    assert g.positions[:4].tolist() == [5, 2, 9, 0]
    assert g.slots[:4].tolist() == [2 * 4 + 1, 4 * 4 + 2, 8 * 4 + 1, 0]  # padded: slot 0
    assert g.seq_lens[:4].tolist() == [6, 3, 10, 1]
    assert g.block_table[:3, :3].tolist() == [[1, 2, 3], [4, 5, 0], [6, 7, 8]]
    assert g.seq_lens[4:].tolist() == [99] * 4  # beyond the replayed size: untouched


def test_sequence_table_puts_decodes_first_then_padded_prefill_chunks():
    inputs = step([5, 0, 3], [1, 6, 4])  # a decode, a fresh prompt, a chunk with context
    table = sequence_table(inputs.attn, torch.device("cpu"))
    assert table.max_query_len == 6
    assert table.query_start.tolist() == [0, 1, 7]
    assert table.query_len.tolist() == [1, 6, 4]
    assert table.seq_len.tolist() == [6, 6, 7]
    assert table.block_table.tolist() == [[1, 2], [4, 5], [6, 7]]
    decodes = sequence_table(step([5, 2], [1, 1]).attn, torch.device("cpu"))
    assert decodes.max_query_len == 1 and decodes.query_len.tolist() == [1, 1]
