"""The CUDA platform and its model runner."""

from __future__ import annotations

import torch

from omnistage.platforms.interface import Platform
from omnistage.worker.model_runner import ModelRunner


class CUDAModelRunner(ModelRunner):
    """CUDA runner: device placement only; sampling dispatch is inherited, never overridden."""


class CudaPlatform(Platform):
    name = "cuda"
    runner_class = CUDAModelRunner

    def __init__(self, device: str = "cuda") -> None:
        if not torch.cuda.is_available():
            raise ValueError(f"device: {device!r} asked for, but torch sees no CUDA device")
        self.device = torch.device(device)
