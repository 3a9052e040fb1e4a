"""How CosyVoice3's flow runs many requests as one batch: the request record, the
right-padded layout and the per-row attention mask.

Items of different lengths are right-padded to the longest, `[B, N_max, C]`, and the
solver runs one DiT forward per Euler step for the whole batch (CFG doubles it to
`2B` rows). A padded frame never changes a real frame of any row, and a row's real
frames are computed exactly as alone (bit for bit, float32 and float64):

- every op of the DiT but attention and the position conv is per frame;
- the position conv is causal (left-padded), so a real frame sees only earlier,
  real frames of its own row;
- attention runs per row over the row's own frames (`dit.RowMasks`): masking the
  padded keys in one batched call was measured to change float32 results by ~1e-6
  (the softmax's and the value product's sums regroup), while the linear layers,
  norms and convs give the same bits for a row whatever the batch's shape;
- the fixed noise is sliced from frame 0 for every row, so a row's real frames get
  exactly the noise they get alone (`noise[:, :, :N]`).

Padding costs the linear layers what it pads, so requests run in groups of similar
lengths (`length_groups`): the longest of a group has at most `PADDING_SLACK` more
frames than its shortest, relatively.

When every item has the same length and attention mode the mask is what one item
alone uses (None for full attention, the `[N, N]` chunk mask when streaming), so a
batch of one is exactly today's unbatched computation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omnistage.families.cosyvoice3.dit import AttentionMask, RowMasks, chunk_mask

PADDING_SLACK = 0.1
"""A group's longest request has at most 10% more frames than its shortest."""


@dataclass(frozen=True)
class FlowRequest:
    """One item of `CosyVoice3Flow.inference_batch` (the arguments of `inference`
    without their batch dimension)."""

    token: torch.Tensor
    """`[T]` speech-token ids."""
    prompt_token: torch.Tensor
    """`[P]` the voice's speech-token ids (P may be 0)."""
    prompt_feat: torch.Tensor
    """`[P * token_mel_ratio, 80]` the voice's mel."""
    embedding: torch.Tensor
    """`[spk_embed_dim]` the voice's x-vector."""
    streaming: bool
    """Chunked attention (the streaming flow)."""
    finalize: bool
    """False: the last `pre_lookahead_len` tokens are right context only."""


def pad_rows(rows: list[torch.Tensor]) -> torch.Tensor:
    """`[N_i, C]` tensors -> `[B, max N_i, C]`, zeros after each row's frames."""
    longest = max(int(r.shape[0]) for r in rows)
    out = rows[0].new_zeros((len(rows), longest, *rows[0].shape[1:]))
    for i, r in enumerate(rows):
        out[i, : r.shape[0]] = r
    return out


def attention_mask(
    lengths: list[int], streaming: list[bool], chunk_size: int, device: torch.device
) -> AttentionMask:
    """The DiT's attention for rows of `lengths` frames.

    None (full attention) or `[N, N]` (the chunk mask) when all rows are alike, else
    `RowMasks`: row b attends among its own real frames only, within its chunk when it
    streams. `chunk_size` 0 means full attention even when streaming."""
    chunked = [s and chunk_size > 0 for s in streaming]
    if len(set(lengths)) == 1 and len(set(chunked)) == 1:
        return chunk_mask(lengths[0], chunk_size, device) if chunked[0] else None
    masks = tuple(
        chunk_mask(n, chunk_size, device) if c else None
        for n, c in zip(lengths, chunked, strict=True)
    )
    return RowMasks(tuple(lengths), masks)


def length_groups(lengths: list[int], slack: float) -> list[list[int]]:
    """Indices of `lengths` in groups run together: sorted by length, a group ends where
    the next length is more than `(1 + slack)` times the group's shortest."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and lengths[i] <= (1 + slack) * lengths[groups[-1][0]]:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups
