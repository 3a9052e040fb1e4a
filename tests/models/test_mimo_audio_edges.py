"""MiMo-Audio's LM -> code2wav conversion (`families/mimo_audio/edges.audio_frames`): seed
003's edge cases on hand-made rows.

- column-major flatten order: a position's codes are its `[channels, group]` block read
  column by column (frame by frame, codebook-interleaved), as the reference's
  `speech_sequence.T.flatten()` and vLLM-Omni's `prepend_and_flatten_colmajor` read it;
- the token filter: a position whose text token is not `<|empty|>` carries no audio;
- all-zero codec rows produce no audio; frames whose first code is the empty id neither;
- a code outside its codebook (a `-1` placeholder) is a ValueError naming step and
  channel; the filter is row by row, so chunks filter to the whole payload's frames.
"""

from __future__ import annotations

import pytest
import torch

from omnistage.families.mimo_audio.edges import MiMoAudioCodes, audio_frames
from omnistage.pipeline.processors import processor_class

EMPTY = 9
GROUP, CHANNELS = 2, 3
EMPTY_IDS = [16, 8, 8]
SIZES = [16, 8, 8]


def frames_of(rows: torch.Tensor, first_step: int = 0) -> torch.Tensor:
    return audio_frames(rows, EMPTY, GROUP, EMPTY_IDS, SIZES, first_step)


def position(block: list[list[int]], token: int = EMPTY) -> list[int]:
    """One row: the text token, then the `[channels][group]` block flattened column-major."""
    return [token, *torch.tensor(block).T.flatten().tolist()]


def test_column_major_order_is_frame_by_frame_codebook_interleaved():
    block = [[1, 2], [3, 4], [5, 6]]  # channel c, frame g
    rows = torch.tensor([position(block)])
    assert frames_of(rows).tolist() == [[1, 3, 5], [2, 4, 6]]
    # vLLM-Omni's layout: the per-position [channels, group] codes, transposed, flattened.
    flat = torch.tensor(block).permute(1, 0).reshape(-1)
    assert frames_of(rows).reshape(-1).tolist() == flat.tolist()


def test_the_token_filter_keeps_only_empty_positions():
    speech = position([[1, 2], [3, 4], [5, 6]])
    text = position([[16, 16], [8, 8], [8, 8]], token=42)
    rows = torch.tensor([text, speech, text])
    assert frames_of(rows).tolist() == [[1, 3, 5], [2, 4, 6]]
    # A text position's codes are never read, whatever they hold.
    rows[0, 1:] = 3
    assert frames_of(rows).tolist() == [[1, 3, 5], [2, 4, 6]]


def test_all_zero_codec_rows_and_empty_frames_give_no_audio():
    zero = position([[0, 0], [0, 0], [0, 0]])
    assert frames_of(torch.tensor([zero, zero])).shape == (0, CHANNELS)
    half = position([[16, 7], [8, 1], [8, 2]])  # frame 0 empty (the reference's own filter)
    assert frames_of(torch.tensor([zero, half])).tolist() == [[7, 1, 2]]
    assert frames_of(torch.zeros(0, 1 + GROUP * CHANNELS, dtype=torch.long)).shape == (0, 3)


def test_a_code_outside_its_codebook_is_named():
    bad = position([[1, 2], [3, -1], [5, 6]])
    with pytest.raises(ValueError, match=r"step 12, channel 1: code -1 .*placeholder"):
        frames_of(torch.tensor([position([[1, 2], [3, 4], [5, 6]]), bad]), first_step=11)
    with pytest.raises(ValueError, match=r"step 0, channel 2: code 8 is outside the codebook 0..7"):
        frames_of(torch.tensor([position([[1, 2], [3, 4], [8, 6]])]))
    with pytest.raises(ValueError, match=r"expected \[steps, 7\] rows"):
        frames_of(torch.zeros(2, 5, dtype=torch.long))


def test_chunks_filter_to_the_whole_payloads_frames():
    g = torch.Generator().manual_seed(0)
    rows = []
    for i in range(9):
        block = torch.randint(0, 8, (CHANNELS, GROUP), generator=g).tolist()
        rows.append(position(block, EMPTY if i % 3 else 5))
    rows = torch.tensor(rows)
    whole = frames_of(rows)
    parts = [frames_of(rows[s : s + 4], s) for s in range(0, 9, 4)]
    assert torch.equal(torch.cat(parts), whole) and whole.shape == (12, 3)


def test_the_edge_is_found_by_name_and_collects_codes():
    cls = processor_class("mimo_audio_codes")
    assert cls is MiMoAudioCodes
    assert cls.input_key == cls.stream_key == "codes.output"
