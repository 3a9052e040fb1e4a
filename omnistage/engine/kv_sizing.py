"""KV cache size: bytes per block, how many blocks a stage gets, and the per-layer tensors.

`num_kv_blocks` if given, else `kv_cache_memory_bytes`, else, on a device whose
platform measures its free memory (CUDA: `gpu_memory_utilization`), what the platform
says is left, at most enough for `max_num_seqs` requests of `max_model_len` tokens,
else (the CPU) that many blocks capped at `DEFAULT_KV_BYTES`.
It must hold at least one request of `max_model_len` tokens, so a lone request
can always finish.
"""

from __future__ import annotations

from typing import Any

import torch

from omnistage.config import EngineConfig
from omnistage.layers.attention import allocate_kv_cache
from omnistage.models.base import CausalLM

DEFAULT_KV_BYTES = 1 << 30


def kv_block_bytes(model: CausalLM, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one KV block over the model's attention layers. A model without attention
    layers (Mamba2) still has blocks for the scheduler's accounting: one element per token."""
    elem = torch.empty((), dtype=dtype).element_size()
    layers = model.num_attention_layers
    if layers == 0:
        return block_size * elem
    return 2 * layers * block_size * model.num_kv_heads * model.head_dim * elem


def num_kv_blocks(config: EngineConfig, block_bytes: int, device_bytes: int | None = None) -> int:
    """How many blocks (the null block included) the stage's KV cache has; `device_bytes`:
    what the platform measured as left for it on its device (None: it does not measure)."""
    assert config.max_model_len is not None  # resolved before this is called
    per_req = -(-config.max_model_len // config.block_size)
    if config.num_kv_blocks is not None:
        blocks = config.num_kv_blocks
    elif config.kv_cache_memory_bytes is not None:
        blocks = config.kv_cache_memory_bytes // block_bytes
    elif device_bytes is not None:  # never more than every sequence at full length needs
        blocks = min(device_bytes // block_bytes - 1, config.max_num_seqs * per_req)
    else:
        blocks = min(config.max_num_seqs * per_req, DEFAULT_KV_BYTES // block_bytes)
    blocks += 1  # the null block
    if blocks - 1 < per_req:
        raise ValueError(
            f"KV cache: {blocks - 1} blocks of {config.block_size} tokens cannot hold one request "
            f"of max_model_len={config.max_model_len}; raise kv_cache_memory_bytes/num_kv_blocks "
            "or gpu_memory_utilization, or lower max_model_len"
        )
    return blocks


def allocate_layer_caches(
    model: Any, blocks: int, block_size: int, dtype: torch.dtype, platform: Any
) -> list[torch.Tensor]:
    """One KV cache tensor per attention layer of `model` (a target, a draft model or an MTP
    module: what has `num_attention_layers`, `num_kv_heads`, `head_dim`), allocated as the
    platform's attention backend allocates them."""
    return [
        allocate_kv_cache(
            blocks,
            block_size,
            model.num_kv_heads,
            model.head_dim,
            dtype,
            platform.device,
            platform.attention_backend,
        )
        for _ in range(model.num_attention_layers)
    ]
