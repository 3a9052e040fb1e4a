"""`speech_frames`: the code frames a multi-codebook vocoder may decode.

A talker writes frames of codes, `[frames, num_quantizers]` (column 0 its own code, the
others a code predictor's), and ends with a frame whose first code is its end code. The
vocoder decodes the frames before that end frame, every code checked against its
codebook: its embedding is often one table for all codebooks, so a code outside
`0..codebook_size-1` would read a neighbouring codebook's row (a `-1` placeholder the
previous codebook's last one) or run off the table. Seed 003's lesson: cut at the end,
never filter frames by their first code.
"""

from __future__ import annotations

import torch

from omnistage.models.generation import GenerationItem, GenerationModel


def speech_frames(
    item: GenerationItem, num_quantizers: int, codebook_size: int, end_code: int | None
) -> torch.Tensor:
    """The item's context and own rows up to the talker's end frame (the first whose first
    code is `end_code`; None: the first whose first code is past the codebook), every code
    checked: a ValueError naming the frame (counted from the request's first) and the
    codebook."""
    rows = item.rows[: item.own_end]  # causal: right-context rows change nothing
    if rows.ndim != 2 or rows.shape[1] != num_quantizers:
        raise ValueError(
            f"codes.audio: expected [frames, {num_quantizers}] codes, got {list(rows.shape)}"
        )
    first = rows[:, 0]
    ends = (first == end_code if end_code is not None else first >= codebook_size).nonzero()
    frames = rows[: int(ends[0, 0])] if ends.numel() else rows
    bad = ((frames < 0) | (frames >= codebook_size)).nonzero()
    if bad.numel():
        frame, book = (int(i) for i in bad[0])
        code = int(frames[frame, book])
        what = "the talker's code" if book == 0 else "a code predictor's code"
        raise ValueError(
            f"codes.audio: frame {item.offset + frame}, codebook {book} ({what}): code "
            f"{code} is outside the codebook 0..{codebook_size - 1}"
            + (" (a placeholder?)" if code < 0 else "")
        )
    return frames


SPEECH_END_KEY = "speech_end"
"""In a stream's `GenerationItem.state`: the index of its end frame in the request's input,
once `check_item` has seen it."""


class CodeFrameVocoder(GenerationModel):
    """A generation model decoding a talker's code frames: it sets `num_quantizers`,
    `codebook_size` and `codec_eos_token_id` (None: the end is the first frame whose
    first code is past the codebook); items are checked as they arrive (`check_item`),
    so a bad one fails its own request."""

    num_quantizers: int
    codebook_size: int
    codec_eos_token_id: int | None

    def speech_frames(self, item: GenerationItem) -> torch.Tensor:
        end = self.codec_eos_token_id
        return speech_frames(item, self.num_quantizers, self.codebook_size, end)

    def check_item(self, item: GenerationItem) -> None:
        """Check the codes before the end frame; a stream's chunks (checked in order as
        they arrive, before any is decoded) remember where its end frame was, so rows
        after it are never checked (`after_speech`), also once the end frame is out of a
        later chunk's left context."""
        if self.after_speech(item) or not item.rows[: item.own_end].numel():
            return
        frames = self.speech_frames(item)
        if item.state is not None and frames.shape[0] < item.own_end:
            item.state[SPEECH_END_KEY] = item.offset + frames.shape[0]

    def after_speech(self, item: GenerationItem) -> bool:
        """Whether every own row of a stream's chunk comes after the end frame an earlier
        `check_item` saw: nothing to check or to speak."""
        end = None if item.state is None else item.state.get(SPEECH_END_KEY)
        return end is not None and end <= item.offset + item.context_len
