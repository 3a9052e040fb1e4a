"""Integer step rows (output ids, code frames) stay Python lists in the accumulator until
a payload takes them: the chunks are the rows in order, int64, whatever steps and cuts
interleave, and no tensor is made per step."""

from __future__ import annotations

import torch

from omnistage.core.edge_processor import CODES_KEY
from tests.pipeline.test_accumulator_rows import accumulator


def test_code_frames_stream_in_order_with_one_tensor_per_cut():
    acc = accumulator("codec_frames", transfer="stream")  # first chunk 1 row, then 2
    frames, chunks = [], []
    for step in range(7):
        codes = [[10 * step + j for j in range(3)]]
        acc.add_step([step], None, 0, codes)
        frames.append([step, *codes[0]])
        assert len(acc.rows[CODES_KEY]) <= 1  # at most the tensor of the last cut
        chunks += [payload[CODES_KEY] for _, _, payload, _ in acc.ready_chunks()]
    chunks += [payload[CODES_KEY] for _, _, payload, _ in acc.final_payloads()]
    assert [c.shape[0] for c in chunks] == [1, 2, 2, 2, 0]
    assert all(c.dtype == torch.int64 for c in chunks)
    assert torch.cat(chunks).tolist() == frames
    assert acc.counts[CODES_KEY] == 7


def test_several_tokens_in_one_step_and_a_whole_payload():
    acc = accumulator("codec_frames")
    acc.add_step([1, 2], None, 0, [[3], [4]])
    acc.add_step([], None, 0, [])
    acc.add_step([5], None, 0, [[6]])
    ((_, _, payload, _),) = acc.final_payloads()
    assert payload[CODES_KEY].tolist() == [[1, 3], [2, 4], [5, 6]]
