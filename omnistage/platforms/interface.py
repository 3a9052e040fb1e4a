"""`Platform`: what differs between devices — the device, the runner class, the attention
backend, threads."""

from __future__ import annotations

from typing import Any

import torch

from omnistage.kernels import work_sharing
from omnistage.layers.attention_backend import TORCH_ATTENTION, AttentionBackend
from omnistage.worker.model_runner import ModelRunner
from omnistage.worker.step_forward import StepForward, eager_forward

SMALL_HIDDEN_SIZE = 256
"""Models with a smaller hidden size compute on one torch thread by default."""

_TORCH_DEFAULT_THREADS = torch.get_num_threads()
"""torch's own default (read before any stage sets it): what a stage without
`num_threads` gets back after a small model's stage in the same process set 1."""


class Platform:
    name: str = "base"
    device: torch.device
    runner_class: type[ModelRunner] = ModelRunner
    attention_backend: AttentionBackend = TORCH_ATTENTION
    """The paged attention's KV allocation and kernels (`layers/attention_backend.py`)."""

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Device-specific preparation after weights are loaded (weight packing, graphs)."""
        return model

    def step_forward(self, config: Any) -> StepForward:
        """How the stage's runner calls its model for a step (`worker/step_forward.py`)."""
        return eager_forward

    def kv_cache_bytes(self, config: Any, model: torch.nn.Module) -> int | None:
        """Bytes left for the KV cache on this device once `model` is loaded, or None where
        the platform does not measure (the CPU: `engine/kv_sizing.py`'s default applies)."""
        return None

    def configure_threads(self, num_threads: int | None, hidden_size: int | None = None) -> None:
        """Set torch's intra-op threads and the C kernels' threads for this process.

        `num_threads` None: the kernels use every available core; torch keeps its
        default (all cores) except for models narrower than `SMALL_HIDDEN_SIZE`, whose
        GEMMs take microseconds: a second torch thread saves less than waking it costs,
        and between ops it spins on the core the engine process needs under
        asynchronous scheduling (measured in README "Performance").
        """
        torch_threads = num_threads or _TORCH_DEFAULT_THREADS
        if num_threads is None and hidden_size is not None and hidden_size < SMALL_HIDDEN_SIZE:
            torch_threads = 1
        torch.set_num_threads(torch_threads)
        work_sharing.set_num_threads(num_threads or work_sharing.available_cores())
