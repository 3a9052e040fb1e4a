"""Platforms: one object per device kind with its device, runner class and thread settings.

No `if device == ...` in the core: the engine asks `platform_for(device)`.
"""

from __future__ import annotations

from omnistage.platforms.interface import Platform


def platform_for(device: str) -> Platform:
    if device == "cpu":
        from omnistage.platforms.cpu import CpuPlatform

        return CpuPlatform()
    if device.startswith("cuda"):
        from omnistage.platforms.cuda import CudaPlatform

        return CudaPlatform(device)
    raise ValueError(f"device: unknown device {device!r}; expected cpu or cuda")
