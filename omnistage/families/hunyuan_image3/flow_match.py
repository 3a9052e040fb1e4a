"""The reference's `FlowMatchDiscreteScheduler` (Euler solver, `reverse=True`): its sigmas,
an Euler step, and `FlowMatchEuler`, one request's scheduler with the diffusers-style
`timesteps` / `step()` the diffusion engine drives.

sigmas = linspace(1, 0, steps + 1) in float32, shifted by `shift` as SD3 does
(s * t / (1 + (s - 1) * t)); the model is fed t = sigma * 1000; an Euler step moves the
sample by (sigma_next - sigma) times the predicted velocity, in float32 (float64
samples stay float64).
"""

from __future__ import annotations

import torch

NUM_TRAIN_TIMESTEPS = 1000


def flow_sigmas(steps: int, shift: float) -> torch.Tensor:
    """[steps + 1] float32 sigmas from 1 to 0."""
    if steps < 1:
        raise ValueError(f"num_inference_steps: expected >= 1, got {steps}")
    sigmas = torch.linspace(1, 0, steps + 1)
    if shift != 1.0:
        sigmas = (shift * sigmas) / (1 + (shift - 1) * sigmas)
    return sigmas


def euler_step(
    sample: torch.Tensor, velocity: torch.Tensor, sigma: torch.Tensor, sigma_next: torch.Tensor
) -> torch.Tensor:
    dtype = torch.float64 if sample.dtype == torch.float64 else torch.float32
    return sample.to(dtype) + velocity.to(dtype) * (sigma_next - sigma).to(dtype)


class FlowMatchEuler:
    """One request's schedule: `timesteps` (sigma * 1000, float32) and `step()`, which
    moves the sample from the current sigma to the next."""

    def __init__(self, steps: int, shift: float) -> None:
        self.sigmas = flow_sigmas(steps, shift)
        self.timesteps = self.sigmas[:-1] * NUM_TRAIN_TIMESTEPS
        self.index = 0

    def step(
        self, velocity: torch.Tensor, timestep: torch.Tensor, sample: torch.Tensor, **_: object
    ) -> tuple[torch.Tensor]:
        """The sample after the current step (`timestep` must be the current one)."""
        if not torch.equal(timestep.reshape(()), self.timesteps[self.index]):
            raise ValueError(f"timestep {float(timestep)} is not step {self.index} of the schedule")
        sigma, sigma_next = self.sigmas[self.index], self.sigmas[self.index + 1]
        self.index += 1
        return (euler_step(sample, velocity, sigma, sigma_next),)
