"""The CPU platform and its model runner."""

from __future__ import annotations

import torch

from omnistage.layers.cpu_attention import CpuKernelAttention
from omnistage.platforms.cpu_linear import pack_linears
from omnistage.platforms.interface import Platform
from omnistage.worker.model_runner import ModelRunner


class CPUModelRunner(ModelRunner):
    """CPU runner: device placement only; sampling dispatch is inherited, never overridden."""


class CpuPlatform(Platform):
    name = "cpu"
    runner_class = CPUModelRunner
    attention_backend = CpuKernelAttention()

    def __init__(self) -> None:
        self.device = torch.device("cpu")

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        pack_linears(model)
        return model
