"""`DecoderStream`: what the Qwen3-TTS codec decoder remembers of a stream's decoded frames
so that it decodes the next chunk's frames alone, as the whole decode would.

The decoder is causal throughout (`codec_convs`, `codec_decoder`): a frame's samples
depend on that frame and the ones before it only. So a stream needs no re-decoded left
context: each causal convolution keeps its last `kernel_size - 1` input samples, each
transposed convolution the input frames its overlap needs, each attention layer the keys
and values of the last `sliding_window - 1` frames, and the transformer the position the
next frame takes. A chunk decoded after the ones before it then gives the samples the
whole decode gives (the same products over the same inputs; up to float rounding where
torch picks another kernel for another length), whatever the chunk sizes.

A decode never changes a stream in place: it reads one and writes the next into a copy
(`advanced`), so a failed call leaves the stream as it was.
"""

from __future__ import annotations

from typing import Any

import torch


class DecoderStream:
    """One stream's decoder state between its chunks."""

    def __init__(self) -> None:
        self.frames = 0
        """Code frames decoded so far: the position of the next chunk's first frame."""
        self.tails: dict[int, Any] = {}
        """Per module (by `id`): the inputs (a convolution's samples, a transposed
        convolution's frames) or keys and values (an attention layer) it keeps."""

    def advanced(self) -> DecoderStream:
        """A copy to decode the next chunk into (the tensors are shared, never written)."""
        copy = DecoderStream()
        copy.frames, copy.tails = self.frames, dict(self.tails)
        return copy

    def tail(self, module: object) -> Any:
        return self.tails.get(id(module))

    def keep(self, module: object, value: Any) -> None:
        self.tails[id(module)] = value


def last(x: torch.Tensor, n: int, dim: int = -1) -> torch.Tensor:
    """The last `n` entries of `x` along `dim` (all of them when there are fewer)."""
    size = x.shape[dim]
    return x.narrow(dim, max(0, size - n), min(n, size))


def window_mask(past: int, length: int, window: int, device: torch.device) -> torch.Tensor:
    """`[length, past + length]` (True: attend): new frame `i` attends the key `j` (the
    `past` kept ones first) that is at most `window - 1` frames before it."""
    query = torch.arange(length, device=device)[:, None] + past
    key = torch.arange(past + length, device=device)[None, :]
    offset = query - key
    return (offset >= 0) & (offset < window)
