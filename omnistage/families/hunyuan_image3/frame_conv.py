"""`FrameConv3d`: the VAE's 3-D convolution computed frame by frame with 2-D ones.

HunyuanImage-3's VAE convolves (frames, height, width) with zero padding in time, and an
image has one or two frames (the encoder repeats it to `ffactor_temporal` frames, the
decoder's temporal upsampling doubles one), so most of a `Conv3d`'s temporal taps fall on
the padding. Each output frame here is the sum of one `conv2d` per temporal tap that lands
on a frame: the same sum in another order (float rounding apart), with the padding's
products skipped and torch's faster 2-D path taken. Measured (one thread, Zen 4, 32 -> 32
channels, 2 frames of 128 x 384): float32 361 -> 46 ms, float64 600 -> 456 ms; at 64 x 192
44 -> 12 and 148 -> 45 ms (docs/performance.md). The weights are `nn.Conv3d`'s, under its
names.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class FrameConv3d(nn.Conv3d):
    """`nn.Conv3d(n_in, n_out, kernel, padding=kernel // 2)`, evaluated per frame (an odd
    `kernel`, as the VAE's 1 and 3: its middle tap always lands on the frame itself)."""

    def __init__(self, n_in: int, n_out: int, kernel: int, dtype: torch.dtype) -> None:
        super().__init__(n_in, n_out, kernel, padding=kernel // 2, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames, taps = x.shape[2], self.kernel_size[0]
        pad_t = taps // 2
        spatial = self.padding[1:]
        weights = [self.weight[:, :, k] for k in range(taps)]
        inputs = x.unbind(2)
        out = []
        for t in range(frames):
            total: torch.Tensor | None = None
            for k in range(taps):
                s = t + k - pad_t
                if 0 <= s < frames:
                    y = F.conv2d(inputs[s], weights[k], None, padding=spatial)
                    total = y if total is None else total.add_(y)
            assert total is not None  # the middle tap (odd kernels only)
            if self.bias is not None:
                total = total.add_(self.bias[:, None, None])
            out.append(total)
        return torch.stack(out, dim=2)
