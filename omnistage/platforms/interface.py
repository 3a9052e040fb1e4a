"""`Platform`: what differs between devices — the device, the runner class, the attention
backend, threads."""

from __future__ import annotations

import torch

from omnistage.kernels import work_sharing
from omnistage.layers.attention_backend import TORCH_ATTENTION, AttentionBackend
from omnistage.worker.model_runner import ModelRunner

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
