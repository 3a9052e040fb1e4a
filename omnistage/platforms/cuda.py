"""The CUDA platform and its model runner: the device, the Triton attention backend, the
KV cache sized from the device's free memory, decode steps from CUDA graphs.

Nothing here is imported on a CPU-only run (`platforms.platform_for`)."""

from __future__ import annotations

import logging
from typing import Any

import torch

from omnistage.platforms.interface import Platform
from omnistage.worker.model_runner import ModelRunner
from omnistage.worker.step_forward import StepForward, eager_forward

logger = logging.getLogger("omnistage")

ACTIVATION_SLACK_BYTES = 512 << 20
"""Kept free beyond the estimated activations: the CUDA context's own growth, Triton's and
cuBLAS's workspaces, the allocator's fragmentation."""


class CUDAModelRunner(ModelRunner):
    """CUDA runner: device placement only; sampling dispatch is inherited, never overridden."""


def activation_bytes(config: Any, model: torch.nn.Module) -> int:
    """An upper estimate of one step's activations: `max_num_batched_tokens` rows of the
    widest projection (a few live at once) and `max_num_seqs` rows of float32 logits (the
    sampler's copies of them)."""
    vocab = widest = 1
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            vocab = max(vocab, module.num_embeddings)
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.out_features != vocab:
            widest = max(widest, module.out_features)
    elem = torch.empty((), dtype=config.torch_dtype).element_size()
    tokens = config.max_num_batched_tokens or config.max_model_len or 2048
    return 4 * tokens * widest * elem + 4 * config.max_num_seqs * vocab * 4


class CudaPlatform(Platform):
    name = "cuda"
    runner_class = CUDAModelRunner

    def __init__(self, device: str = "cuda") -> None:
        if not torch.cuda.is_available():
            raise ValueError(f"device: {device!r} asked for, but torch sees no CUDA device")
        self.device = torch.device(device)
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(self.device)
        try:
            from omnistage.layers.cuda_attention import TritonAttention

            self.attention_backend = TritonAttention()
        except ImportError:  # a CUDA torch without Triton: the portable torch attention
            logger.warning("Triton is not installed: attention on %s takes the torch path", device)

    def step_forward(self, config: Any) -> StepForward:
        """Decode steps replayed from CUDA graphs (`platforms/cuda_graphs.py`), unless the
        config asks for `enforce_eager`."""
        if config.enforce_eager:
            return eager_forward
        from omnistage.platforms.cuda_graphs import DecodeGraphs

        max_blocks = -(-config.max_model_len // config.block_size)
        return DecodeGraphs(config.max_num_seqs, max_blocks, self.device, self.attention_backend)

    def kv_cache_bytes(self, config: Any, model: torch.nn.Module) -> int | None:
        """What `gpu_memory_utilization` of the device leaves once this process's model is
        loaded, less the step's activations; never more than is free now (other processes
        on the device keep theirs)."""
        free, total = torch.cuda.mem_get_info(self.device)
        held = torch.cuda.memory_reserved(self.device)
        allowed = min(config.gpu_memory_utilization * total - held, free)
        return max(0, int(allowed - activation_bytes(config, model) - ACTIVATION_SLACK_BYTES))
