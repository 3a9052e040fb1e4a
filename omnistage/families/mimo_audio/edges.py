"""MiMo-Audio's LM -> code2wav edge: which of the LM's codes are audio, in which order.

The LM stage sends, per step (one LM position), its text token and the `group_size x
audio_channels` codes sampled with it (`codes.output` rows `[steps, 1 + G*C]`, the codes
frame-major: the reference's `[channels, group]` block flattened column-major, so
codebook-interleaved). `audio_frames` is seed 003's conversion to the `codes.audio` the
tokenizer decodes, `[frames, channels]` (its row-major flattening is the column-major,
codebook-interleaved sequence vLLM-Omni sends):

- the token filter: only a step whose text token is `<|empty|>` speaks; any other
  step's codes are the channels' empty ids and carry no audio;
- all-zero codec rows (a step whose codes are all 0: vLLM-Omni's form of a position that
  wrote no speech) produce no audio;
- a frame whose first code is its channel's empty id is dropped (the reference's own
  filter, `speech_sequence[0] != speech_zeroemb_idx[0]`);
- every code left must be inside its codebook: a ValueError names the step, frame and
  channel (a `-1` placeholder never reaches the decoder).

The filter works row by row, so a stream's chunks filter to exactly the frames the whole
payload does. `meta.finished` marks the last chunk (the accumulator sets it once).
"""

from __future__ import annotations

import torch

from omnistage.core.edge_processor import CODES_KEY, Accumulate, EdgeProcessor


class MiMoAudioCodes(EdgeProcessor):
    """LM -> code2wav: the LM's steps (token and codes) go whole or in chunks of steps;
    code2wav turns them into frames with `audio_frames` (it knows the checkpoint's
    `<|empty|>` id, group size and channels)."""

    name = "mimo_audio_codes"

    accumulate = {CODES_KEY: Accumulate.CONCAT}
    stream_key = CODES_KEY
    input_key = CODES_KEY


def audio_frames(
    rows: torch.Tensor,
    empty_token_id: int,
    group_size: int,
    empty_ids: list[int],
    codebook_sizes: list[int],
    first_step: int = 0,
) -> torch.Tensor:
    """`codes.output` rows [steps, 1 + G*C] -> the audio frames [frames, C] they carry
    (see the module docstring); `first_step` numbers the rows in error messages."""
    channels = len(empty_ids)
    if rows.ndim != 2 or rows.shape[1] != 1 + group_size * channels:
        raise ValueError(
            f"codes.audio: expected [steps, {1 + group_size * channels}] rows (text token, "
            f"then {group_size} frames of {channels} codes), got {list(rows.shape)}"
        )
    codes = rows[:, 1:].long()
    speaks = (rows[:, 0] == empty_token_id) & (codes != 0).any(dim=1)
    steps = speaks.nonzero().flatten()
    frames = codes[steps].reshape(-1, channels)
    frame_step = steps.repeat_interleave(group_size)
    keep = frames[:, 0] != empty_ids[0]
    frames, frame_step = frames[keep], frame_step[keep]
    limit = torch.tensor(codebook_sizes, dtype=torch.long)
    bad = ((frames < 0) | (frames >= limit)).nonzero()
    if bad.numel():
        frame, channel = (int(i) for i in bad[0])
        code = int(frames[frame, channel])
        raise ValueError(
            f"codes.audio: step {first_step + int(frame_step[frame])}, channel {channel}: code "
            f"{code} is outside the codebook 0..{codebook_sizes[channel] - 1}"
            + (" (a placeholder?)" if code < 0 else "")
        )
    return frames
