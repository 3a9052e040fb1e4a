"""The talker's flow-matching head: from the LM's last hidden state and the latent history,
one patch of continuous audio latents (the reference's `FlowLoss.sample` -> `CFM.sample`,
inclusionAI/Ming-omni-tts `fm/flowloss.py`, `fm/CFM.py`).

Per request (one row; each row is computed alone, so a batch equals its rows alone):

- y0 = noise [P, C] (drawn first, as [C, P] transposed: the reference's draw);
- 10 Euler steps over the EPSS times {0, 2, 4, 6, 8, 12, 16, 20, 24, 28, 32} / 32,
  warped by sway sampling (t + s (cos(pi t / 2) - 1 + t), s = -1) — the reference's
  `CFM.sample` defaults, which `FlowLoss.sample` never overrides (the config's `steps`
  is not read on this path);
- velocity with classifier-free guidance: v = v_c + cfg (v_c - v_u), v_u with the
  condition zeroed; the DiT sees [t + cond, history, x] and its last P outputs are v;
- after each step but the last, y += sigma sqrt(temperature) sqrt(dt) * noise; the noise
  is drawn after every step, the last included, and at temperature 0 too, as the
  reference draws it. The result is y after the last Euler step.

Randomness comes from the request's generator only (invariant 3): with a CPU generator
seeded s, the draws are the reference's under `torch.manual_seed(s)`.
"""

from __future__ import annotations

import math

import torch

from omnistage.families.ming_flash_omni.dit import DiT

EPSS_10 = (0, 2, 4, 6, 8, 12, 16, 20, 24, 28, 32)
SWAY = -1.0


def flow_times(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The 11 integration times of the reference's 10-step EPSS schedule, sway-warped."""
    t = torch.tensor(EPSS_10, dtype=dtype) / 32
    return t + SWAY * (torch.cos(math.pi / 2 * t) - 1 + t)


class FlowHead:
    """Samples latent patches with a `DiT` (see the module docstring)."""

    def __init__(self, dit: DiT, latent_dim: int, patch_size: int) -> None:
        self.dit = dit
        self.latent_dim = latent_dim
        self.patch_size = patch_size

    def velocity(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        cond: torch.Tensor,
        history: torch.Tensor,
        cfg: float,
    ) -> torch.Tensor:
        """Guided velocity [1, P, C] at time t for one row."""
        both = self.dit(
            torch.cat([x, x]),
            t.expand(2),
            torch.cat([cond, torch.zeros_like(cond)]),
            torch.cat([history, history]),
        )[:, -self.patch_size :]
        pred, null = both.chunk(2)
        return pred + (pred - null) * cfg

    @torch.no_grad()
    def sample(
        self,
        cond: torch.Tensor,
        history: torch.Tensor,
        generator: torch.Generator | None,
        cfg: float = 2.0,
        sigma: float = 0.25,
        temperature: float = 0.0,
    ) -> torch.Tensor:
        """One patch [1, P, C] for one row: cond [1, 1, hidden], history [1, Hp, C]."""
        dtype = history.dtype
        draw = torch.randn((1, self.latent_dim, self.patch_size), generator=generator)
        y = draw.to(dtype).transpose(1, 2)
        times = flow_times().to(dtype)
        for i in range(len(times) - 1):
            t0, t1 = times[i], times[i + 1]
            dt = t1 - t0
            y = y + dt * self.velocity(y, t0, cond, history, cfg)
            # Drawn every step, as the reference does, so that the generator's stream
            # (and so the next patch's noise) is the reference's at any temperature.
            # The reference's `randn_like(y)`: y is the transposed [C, P] draw, and a
            # normal draw into that strided layout takes torch's element-wise path (other
            # values than a contiguous draw of the same size): drawn the same way here.
            noise = torch.empty(draw.shape).transpose(1, 2).normal_(generator=generator)
            noise = noise.to(dtype)
            if i < len(times) - 2:
                y = y + sigma * (temperature**0.5) * (abs(dt) ** 0.5) * noise
        return y

    def skip_patch(self, generator: torch.Generator) -> None:
        """Advance `generator` past the draws of one `sample` (its noise, then one draw per
        Euler step, drawn alike), without computing the patch."""
        draw = torch.randn((1, self.latent_dim, self.patch_size), generator=generator)
        for _ in range(len(EPSS_10) - 1):
            torch.empty(draw.shape).transpose(1, 2).normal_(generator=generator)


def slide_history(history: torch.Tensor, patch: torch.Tensor) -> torch.Tensor:
    """The reference's latent history after a step: drop the oldest P frames, append `patch`."""
    return torch.cat([history[:, patch.shape[1] :], patch], dim=1)
