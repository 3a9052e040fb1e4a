"""The normalizing flows of EMOVA's unit-to-speech decoder, run in reverse (sampling): the
stochastic duration predictor (an elementwise affine and rational-quadratic spline
coupling flows, `dp.*`) and the mean-only residual coupling flow from the prior to the
waveform decoder's latent (`flow.*`). Parameter names and module indices are UVITS's
(`flows.0.m`, `flows.1.pre`, `flows.1.convs.convs_sep.0`, …; the flips hold no weights).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.dynin_omni.vits_layers import DDSConv, WaveNet

MIN_BIN, MIN_DERIVATIVE = 1e-3, 1e-3


class Flip(nn.Module):
    """Reverses the channel order (no weights; keeps UVITS's module indices)."""

    def forward(self, x: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        return torch.flip(x, [1])


class ElementwiseAffine(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.m = nn.Parameter(torch.zeros(channels, 1))
        self.logs = nn.Parameter(torch.zeros(channels, 1))

    def forward(self, x: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        return (x - self.m) * torch.exp(-self.logs)


def _bins(unnormalized: torch.Tensor, low: float, high: float) -> tuple[torch.Tensor, ...]:
    """Bin edges (low..high) and sizes from unnormalized bin widths or heights."""
    n = unnormalized.shape[-1]
    sizes = MIN_BIN + (1 - MIN_BIN * n) * F.softmax(unnormalized, dim=-1)
    edges = F.pad(torch.cumsum(sizes, dim=-1), (1, 0), value=0.0)
    edges = (high - low) * edges + low
    edges[..., 0], edges[..., -1] = low, high
    return edges, edges[..., 1:] - edges[..., :-1]


def inverse_spline(
    y: torch.Tensor, widths: torch.Tensor, heights: torch.Tensor, derivs: torch.Tensor, bound: float
) -> torch.Tensor:
    """The inverse of the monotone rational-quadratic spline on [-bound, bound] with
    identity tails (`unconstrained_rational_quadratic_spline(inverse=True, tails='linear')`)."""
    constant = float(np.log(np.exp(1 - MIN_DERIVATIVE) - 1))
    derivs = F.pad(derivs, (1, 1), value=constant)
    inside = (y >= -bound) & (y <= bound)
    out = y.clone()
    yi, w, h, d = y[inside], widths[inside], heights[inside], derivs[inside]
    cumw, binw = _bins(w, -bound, bound)
    cumh, binh = _bins(h, -bound, bound)
    d = MIN_DERIVATIVE + F.softplus(d)
    located = cumh.clone()
    located[..., -1] += 1e-6
    idx = (torch.sum(yi[..., None] >= located, dim=-1) - 1)[..., None]

    def at(t: torch.Tensor) -> torch.Tensor:
        return t.gather(-1, idx)[..., 0]

    delta = binh / binw
    x0, bw, y0, bh, dl = at(cumw), at(binw), at(cumh), at(binh), at(delta)
    d0, d1 = at(d), d[..., 1:].gather(-1, idx)[..., 0]
    s = d0 + d1 - 2 * dl
    a = (yi - y0) * s + bh * (dl - d0)
    b = bh * d0 - (yi - y0) * s
    c = -dl * (yi - y0)
    root = (2 * c) / (-b - torch.sqrt(b.pow(2) - 4 * a * c))
    out[inside] = root * bw + x0
    return out


class ConvFlow(nn.Module):
    """Spline coupling: the second channel half is transformed by a spline whose bins the
    first half (and the conditioning) predict."""

    def __init__(self, in_channels: int, filter_channels: int, kernel_size: int) -> None:
        super().__init__()
        self.half, self.filter, self.bins, self.bound = in_channels // 2, filter_channels, 10, 5.0
        self.pre = nn.Conv1d(self.half, filter_channels, 1)
        self.convs = DDSConv(filter_channels, kernel_size, 3)
        self.proj = nn.Conv1d(filter_channels, self.half * (self.bins * 3 - 1), 1)

    def forward(self, x: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        x0, x1 = torch.split(x, [self.half] * 2, 1)
        h = self.proj(self.convs(self.pre(x0), g=g))
        b, c, t = x0.shape
        h = h.reshape(b, c, -1, t).permute(0, 1, 3, 2)
        scale = math.sqrt(self.filter)
        n = self.bins
        x1 = inverse_spline(x1, h[..., :n] / scale, h[..., n : 2 * n] / scale, h[..., 2 * n :], 5.0)
        return torch.cat([x0, x1], 1)


class StochasticDurationPredictor(nn.Module):
    """Log-durations of the units, sampled from noise through the reversed flows (the
    reference's `reverse=True` path; its posterior flows only train and are not loaded)."""

    def __init__(self, channels: int, kernel_size: int, gin: int, n_flows: int = 4) -> None:
        super().__init__()
        self.pre = nn.Conv1d(channels, channels, 1)
        self.convs = DDSConv(channels, kernel_size, 3)
        self.proj = nn.Conv1d(channels, channels, 1)
        self.cond = nn.Conv1d(gin, channels, 1)
        self.flows = nn.ModuleList([ElementwiseAffine(2)])
        for _ in range(n_flows):
            self.flows.extend([ConvFlow(2, channels, kernel_size), Flip()])

    def forward(self, x: torch.Tensor, g: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """`noise`: [b, 2, t] standard normal draws already scaled by `noise_scale_w`."""
        x = self.proj(self.convs(self.pre(x) + self.cond(g)))
        flows = list(reversed(self.flows))
        z = noise
        for flow in flows[:-2] + [flows[-1]]:  # the first spline flow is not used in reverse
            z = flow(z, g=x)
        return z[:, :1]


class ResidualCoupling(nn.Module):
    """Mean-only affine coupling: the second half minus what the first half predicts."""

    def __init__(self, channels: int, hidden: int, kernel_size: int, n_layers: int, gin: int):
        super().__init__()
        self.half = channels // 2
        self.pre = nn.Conv1d(self.half, hidden, 1)
        self.enc = WaveNet(hidden, kernel_size, 1, n_layers, gin)
        self.post = nn.Conv1d(hidden, self.half, 1)

    def forward(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        x0, x1 = torch.split(x, [self.half] * 2, 1)
        return torch.cat([x0, x1 - self.post(self.enc(self.pre(x0), g))], 1)


class CouplingFlow(nn.Module):
    """UVITS `ResidualCouplingBlock` (kernel 5, 4 WaveNet layers per coupling), reversed."""

    def __init__(self, channels: int, hidden: int, gin: int, n_flows: int = 4) -> None:
        super().__init__()
        self.flows = nn.ModuleList()
        for _ in range(n_flows):
            self.flows.extend([ResidualCoupling(channels, hidden, 5, 4, gin), Flip()])

    def forward(self, z: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        for flow in reversed(self.flows):
            z = flow(z, g=g)
        return z
