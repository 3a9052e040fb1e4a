"""`AttentionBackend`: what a platform supplies to the paged attention of `layers/attention.py`.

Models call `attend` / `rope_and_write_kv` / `write_kv` and never ask which
device they run on. The step's `AttentionMetadata` carries the backend the
platform chose (`Platform.attention_backend`): this portable one runs torch ops
on any device; the CPU platform's (`layers/cpu_attention.py`) runs our C
kernels where they apply; the CUDA platform's (`layers/cuda_attention.py`) attends a
whole step in one Triton kernel. No model or runner changes between them. `meta` is the
step's `AttentionMetadata` (which carries the backend, so it is not imported here).
"""

from __future__ import annotations

from typing import Any

import torch


class AttentionBackend:
    """Portable attention: the KV cache from `torch.zeros`, every path in torch."""

    name = "torch"
    runs_decode_programs = False
    """Whether a step of decodes may run as a decode program (`layers/decode_program.py`):
    its ops are this backend's kernels on this backend's KV cache."""

    def allocate_kv_cache(
        self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """A zeroed cache of `shape`: padded slots are masked, and 0 * (masked garbage)
        must never be NaN."""
        return torch.zeros(shape, dtype=dtype, device=device)

    def rope_and_write_kv(
        self,
        qkv: torch.Tensor,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: Any,
        heads: int,
    ) -> bool:
        """Rotate q and k inside `qkv` and write k, v to the cache in one fused call; False
        (having done nothing) where the backend has no such call for these tensors."""
        return False

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: Any,
        scale: float,
    ) -> torch.Tensor | None:
        """The whole step's attention (prefill chunks and decodes), or None: the torch paths
        (with `decode` for the decodes) then run."""
        return None

    def decode(
        self, q: torch.Tensor, kv_cache: torch.Tensor, meta: Any, scale: float
    ) -> torch.Tensor | None:
        """The decodes' attention (one query token per request), or None: the portable
        torch path then runs."""
        return None


TORCH_ATTENTION = AttentionBackend()
"""The portable backend: the default of a step's metadata and of every non-CPU platform."""
