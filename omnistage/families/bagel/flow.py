"""Bagel's flow matching: the shifted time schedule, Euler steps and guided velocities.

Time runs from 1 (noise) to 0 (image) on `steps + 1` evenly spaced points, each
moved by the shift `s`: `t' = s t / (1 + (s - 1) t)`. A step at `t_i` moves the
latents by `-v (t_i - t_{i+1})` (the velocity points from data to noise).
`FlowEulerScheduler` is that schedule with a diffusers-like `step`, so the
diffusion engine drives it as it drives diffusers' schedulers.

Guidance (the reference's `_forward_flow`): `v` is the velocity with the full
context, `v_text` without the text (the empty context), `v_img` without the input
images (for text-to-image: the same context as `v`). Inside `cfg_interval`
(`lo < t <= hi`) and with a scale above 1:
`v_text' = v_text + text_scale (v - v_text)`, then
`v' = v_img + img_scale (v_text' - v_img)`, then renormalised so its norm (over
the whole image: "global"; or per token: "channel") is at most `v`'s and at least
`renorm_min` times it. "text_channel" renormalises `v_text'` per token instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

RENORM_TYPES = ("global", "channel", "text_channel")
OPTIONS = ("cfg_img_scale", "cfg_interval", "cfg_renorm_type", "cfg_renorm_min", "timestep_shift")
"""The per-request `model_options` of Bagel's draw stage (the reference's names)."""


@dataclass(frozen=True)
class GuidanceSettings:
    """Classifier-free guidance beyond the text scale (the inferencer's text-to-image defaults)."""

    img_scale: float = 1.0
    interval: tuple[float, float] = (0.4, 1.0)
    renorm_min: float = 0.0
    renorm_type: str = "global"

    def __post_init__(self) -> None:
        if not _number(self.img_scale) or not self.img_scale >= 0:
            raise ValueError(f"cfg_img_scale: expected a number >= 0, got {self.img_scale!r}")
        interval = self.interval
        if (
            not isinstance(interval, (tuple, list))
            or len(interval) != 2
            or not all(_number(v) for v in interval)
            or not 0 <= interval[0] <= interval[1] <= 1
        ):
            raise ValueError(
                f"cfg_interval: expected [lo, hi] with 0 <= lo <= hi <= 1, got {interval!r}"
            )
        if not _number(self.renorm_min) or not 0 <= self.renorm_min <= 1:
            raise ValueError(
                f"cfg_renorm_min: expected a number in [0, 1], got {self.renorm_min!r}"
            )
        if self.renorm_type not in RENORM_TYPES:
            raise ValueError(
                f"cfg_renorm_type: {self.renorm_type!r} is not one of {', '.join(RENORM_TYPES)}"
            )

    def scales(self, t: float, text_scale: float) -> tuple[float, float]:
        """The (text, image) scales in force at time `t` (1.0: that branch is off)."""
        lo, hi = self.interval
        if lo < t <= hi:
            return text_scale, self.img_scale
        return 1.0, 1.0


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def read_options(options: Mapping[str, Any], default_shift: float) -> dict[str, Any]:
    """Bagel's `model_options` checked (ValueError naming the option), defaults filled in
    (the inferencer's text-to-image ones, `GuidanceSettings()`, and `default_shift`)."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"{unknown[0]}: not a Bagel option; known: {', '.join(OPTIONS)}")
    base = GuidanceSettings()
    settings = GuidanceSettings(
        img_scale=options.get("cfg_img_scale", base.img_scale),
        interval=options.get("cfg_interval", base.interval),
        renorm_min=options.get("cfg_renorm_min", base.renorm_min),
        renorm_type=options.get("cfg_renorm_type", base.renorm_type),
    )
    shift = options.get("timestep_shift", default_shift)
    if not _number(shift) or not shift > 0:
        raise ValueError(f"timestep_shift: expected a number > 0, got {shift!r}")
    return {
        "cfg_img_scale": float(settings.img_scale),
        "cfg_interval": [float(v) for v in settings.interval],
        "cfg_renorm_min": float(settings.renorm_min),
        "cfg_renorm_type": settings.renorm_type,
        "timestep_shift": float(shift),
    }


def settings_of(options: Mapping[str, Any]) -> GuidanceSettings:
    """The guidance settings of options `read_options` returned."""
    return GuidanceSettings(
        img_scale=options["cfg_img_scale"],
        interval=tuple(options["cfg_interval"]),
        renorm_min=options["cfg_renorm_min"],
        renorm_type=options["cfg_renorm_type"],
    )


def time_points(steps: int, shift: float) -> torch.Tensor:
    """The `steps + 1` shifted times from 1 to 0 (float32, as the reference)."""
    t = torch.linspace(1, 0, steps + 1)
    return shift * t / (1 + (shift - 1) * t)


class FlowEulerScheduler:
    """Euler steps over `time_points`: `timesteps` the `steps` times evaluated."""

    def __init__(self, steps: int, shift: float) -> None:
        points = time_points(steps, shift)
        self.timesteps = points[:-1]
        self.dts = points[:-1] - points[1:]
        self._index = 0

    def step(
        self, velocity: torch.Tensor, timestep: Any, sample: torch.Tensor, return_dict: bool = False
    ) -> tuple[torch.Tensor]:
        """`sample` moved one step along `-velocity` (steps are taken in order)."""
        dt = self.dts[self._index]
        self._index += 1
        return (sample - velocity.to(sample.dtype) * dt,)


def guided(
    v: torch.Tensor,
    v_text: torch.Tensor | None,
    v_img: torch.Tensor | None,
    scales: tuple[float, float],
    settings: GuidanceSettings,
) -> torch.Tensor:
    """The guided velocity of one image from its branch velocities (None: branch off)."""
    text_scale, img_scale = scales
    if text_scale <= 1.0 or v_text is None:
        return v
    mixed = v_text + text_scale * (v - v_text)
    if settings.renorm_type == "text_channel":
        norm = torch.norm(v, dim=-1, keepdim=True)
        scale = (norm / (torch.norm(mixed, dim=-1, keepdim=True) + 1e-8)).clamp(
            min=settings.renorm_min, max=1.0
        )
        mixed = mixed * scale
        return mixed if img_scale <= 1.0 else v_img + img_scale * (mixed - v_img)
    if img_scale > 1.0:
        mixed = v_img + img_scale * (mixed - v_img)
    if settings.renorm_type == "global":
        norm, norm_mixed = torch.norm(v), torch.norm(mixed)
    else:
        norm = torch.norm(v, dim=-1, keepdim=True)
        norm_mixed = torch.norm(mixed, dim=-1, keepdim=True)
    scale = (norm / (norm_mixed + 1e-8)).clamp(min=settings.renorm_min, max=1.0)
    return mixed * scale
