"""`Platform`: what differs between devices — the device, the runner class, threads."""

from __future__ import annotations

import torch

from omnistage.worker.model_runner import ModelRunner


class Platform:
    name: str = "base"
    device: torch.device
    runner_class: type[ModelRunner] = ModelRunner

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Device-specific preparation after weights are loaded (weight packing, graphs)."""
        return model

    def configure_threads(self, num_threads: int | None) -> None:
        """Set torch's intra-op threads for this process (None: leave the default)."""
        if num_threads is not None:
            torch.set_num_threads(num_threads)
