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


def runner_classes() -> dict[str, type]:
    """Every platform's model runner class (tests check none bypasses the sampling dispatch)."""
    from omnistage.platforms.cpu import CPUModelRunner
    from omnistage.platforms.cuda import CUDAModelRunner

    return {"cpu": CPUModelRunner, "cuda": CUDAModelRunner}
