"""The CPU platform's attention backend: the KV cache from lazily zeroed pages, RoPE + KV
write and decode attention in our C kernels (`kernels/rope_cache.c`,
`kernels/paged_attention.c`) for float32 and bfloat16 tensors (a bfloat16 cache's blocks
are widened to float32 as they are read; queries and outputs go through float32); anything
else takes the torch path."""

from __future__ import annotations

import math
import mmap
from typing import Any

import torch

from omnistage import kernels
from omnistage.kernels import work_sharing
from omnistage.layers.attention import AttentionMetadata
from omnistage.layers.attention_backend import AttentionBackend

PARALLEL_DECODE_WORK = 16384
"""Context tokens x KV heads of a decode step from which its attention kernel runs on
several threads (below, waking a helper costs more than it saves)."""


class CpuKernelAttention(AttentionBackend):
    name = "cpu"
    runs_decode_programs = True

    def allocate_kv_cache(
        self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """Zeros from an anonymous `mmap`: the OS hands out zero pages lazily, so a 1 GiB
        cache costs nothing until blocks are written, where `torch.zeros` would touch every
        page at start-up (seconds on this machine). Not numpy's allocator: it advises huge
        pages for large arrays, and the first write into each 2 MB region (one per layer,
        k/v and KV head) then waits for the kernel to find and zero a huge page: 0.25-0.4 s
        in a first step of SmolLM2 where 4 KB pages take 0.01 s, with decode speed
        unchanged (measured at batch 1 and 32)."""
        elem = torch.empty((), dtype=dtype).element_size()
        nbytes = elem * math.prod(shape)
        pages = mmap.mmap(-1, max(nbytes, 1))
        return torch.frombuffer(pages, dtype=torch.uint8, count=nbytes).view(dtype).view(shape)

    def rope_and_write_kv(
        self,
        qkv: torch.Tensor,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        heads: int,
    ) -> bool:
        suffix = kernels.kernel_suffix(qkv, cos, sin, kv_cache)
        if suffix is None or not qkv.is_contiguous():
            return False
        lib = kernels.load()
        if lib is None:
            return False
        _, kv_heads, num_blocks, block_size, head_dim = kv_cache.shape
        getattr(lib, f"rope_write_kv_{suffix}")(
            qkv.data_ptr(),
            qkv.shape[0],
            heads,
            kv_heads,
            head_dim,
            positions.data_ptr(),
            cos.data_ptr(),
            sin.data_ptr(),
            kv_cache.data_ptr(),
            num_blocks * block_size,
            meta.slot_mapping.data_ptr(),
            torch.get_num_threads(),
        )
        return True

    def decode(
        self, q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float
    ) -> torch.Tensor | None:
        """The C kernel reads the blocks in place where it can (float32 or bfloat16, its
        limits)."""
        suffix = kernels.kernel_suffix(q, kv_cache)
        if suffix is None:
            return None
        lib = kernels.load()
        _, kv_heads, _, block_size, head_dim = kv_cache.shape
        if lib is None or not lib.paged_decode_limits_ok(
            q.shape[1] // kv_heads, block_size, head_dim
        ):
            return None
        if suffix == "f32":
            return decode_kernel(lib, q, kv_cache, meta, scale)
        return decode_kernel(lib, q.float(), kv_cache, meta, scale, suffix).to(q.dtype)


def decode_kernel(
    lib: Any,
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    cache_suffix: str = "f32",
) -> torch.Tensor:
    """float32 `q` over a float32 (`cache_suffix` "f32") or bfloat16 ("bf16") cache."""
    q = q.contiguous()
    out = torch.empty_like(q)
    table = meta.decode_block_table
    _, kv_heads, num_blocks, block_size, head_dim = kv_cache.shape
    work_sharing.run(
        getattr(lib, f"paged_decode_attention_{cache_suffix}"),
        getattr(lib, f"paged_decode_attention_{cache_suffix}_team"),
        q.data_ptr(),
        kv_cache.data_ptr(),
        table.data_ptr(),
        meta.decode_seq_lens.data_ptr(),
        out.data_ptr(),
        q.shape[0],
        q.shape[1],
        kv_heads,
        head_dim,
        num_blocks,
        block_size,
        table.shape[1],
        scale,
        parallel=meta.decode_context_tokens * kv_heads >= PARALLEL_DECODE_WORK,
    )
    return out
