"""`DiffusionParams`: what a request asks of a diffusion stage.

The diffusion counterpart of `SamplingParams`: image size, number of
denoising steps, classifier-free guidance scale, seed and negative prompt.
`__post_init__` checks what can be checked without the model (types, steps
>= 1, guidance >= 0); `DiffusionModel.check_params` checks the rest (sizes the
model supports) before any stage runs. Every problem is a `ValueError` naming
the field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_SEED = 2**63 - 1


@dataclass
class DiffusionParams:
    height: int | None = None
    """Image height in pixels; None: the model's default."""
    width: int | None = None
    """Image width in pixels; None: the model's default."""
    num_inference_steps: int | None = None
    """Denoising steps (>= 1); None: the model's default."""
    guidance_scale: float | None = None
    """Classifier-free guidance scale (>= 0; <= 1 turns guidance off); None: the model's
    default."""
    seed: int | None = None
    """Seed of the request's initial noise: the same seed gives the same image whatever
    else is in the batch. None: derived from the stage's engine seed and the prompt."""
    negative_prompt: str = ""
    """What the unconditional branch of guidance is conditioned on."""
    progress: bool = False
    """Report a progress event after every denoising step (for streaming clients)."""
    model_options: dict[str, Any] = field(default_factory=dict)
    """Parameters only some models take, by name (Bagel: `cfg_img_scale`, `cfg_interval`,
    `cfg_renorm_type`, `cfg_renorm_min`, `timestep_shift`), checked by the model before
    any stage runs: one it does not take is a ValueError naming it."""

    def __post_init__(self) -> None:
        for name in ("height", "width", "num_inference_steps"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
        scale = self.guidance_scale
        if scale is not None:
            if isinstance(scale, bool) or not isinstance(scale, (int, float)):
                raise ValueError(f"guidance_scale: expected a number >= 0, got {scale!r}")
            if not scale >= 0 or scale == float("inf"):
                raise ValueError(f"guidance_scale: expected a finite number >= 0, got {scale!r}")
            self.guidance_scale = float(scale)
        if self.seed is not None and (type(self.seed) is not int or not 0 <= self.seed <= MAX_SEED):
            raise ValueError(f"seed: expected an integer in [0, 2**63), got {self.seed!r}")
        if not isinstance(self.negative_prompt, str):
            raise ValueError("negative_prompt: expected a string")
        if not isinstance(self.progress, bool):
            raise ValueError("progress: expected true or false")
        options = self.model_options
        if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
            raise ValueError("model_options: expected a mapping of option names to values")
        self.model_options = dict(options)

    def to_fields(self) -> dict[str, Any]:
        """The fields the request sets (those not at their defaults): what travels to the
        stage, laid over the stage's `default_sampling` there."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != (f.default if f.name != "model_options" else {})
        }

    @classmethod
    def from_fields(cls, fields: dict[str, Any] | None) -> DiffusionParams:
        known = {f.name for f in dataclasses.fields(cls)}
        fields = dict(fields or {})
        unknown = sorted(set(fields) - known)
        if unknown:
            raise ValueError(
                f"{unknown[0]}: not a diffusion parameter; known: {', '.join(sorted(known))}"
            )
        return cls(**fields)


@dataclass(frozen=True)
class ResolvedDiffusionParams:
    """A request's parameters with the model's defaults filled in and checked."""

    height: int
    width: int
    num_inference_steps: int
    guidance_scale: float
    seed: int
    negative_prompt: str
    progress: bool
    model_options: Mapping[str, Any] = field(default_factory=dict)
    """`DiffusionParams.model_options` as the model checked them (its defaults filled in)."""

    @property
    def uses_guidance(self) -> bool:
        return self.guidance_scale > 1.0

    @property
    def batch_key(self) -> tuple[int, int, int]:
        """Requests with equal keys can share a denoising step."""
        return (self.height, self.width, self.num_inference_steps)
