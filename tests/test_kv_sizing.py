"""How many KV blocks a stage gets: given, from a byte budget, from what the platform
measured free on its device (CUDA's `gpu_memory_utilization`), or the CPU default; and a
config naming a bad `gpu_memory_utilization` is refused."""

from __future__ import annotations

import pytest

from omnistage.config import EngineConfig
from omnistage.engine.kv_sizing import DEFAULT_KV_BYTES, num_kv_blocks
from omnistage.platforms import platform_for

BLOCK_BYTES = 1 << 16


def config(**args) -> EngineConfig:
    return EngineConfig(max_model_len=256, max_num_seqs=8, **args)  # 16 blocks a request


def test_a_device_budget_sizes_the_cache_up_to_what_every_sequence_needs():
    assert num_kv_blocks(config(), BLOCK_BYTES, device_bytes=40 * BLOCK_BYTES) == 40
    # 8 sequences of 16 blocks: more than 128 usable blocks are never taken.
    assert num_kv_blocks(config(), BLOCK_BYTES, device_bytes=10**6 * BLOCK_BYTES) == 129
    # Given sizes win over what the device could hold.
    assert num_kv_blocks(config(num_kv_blocks=20), BLOCK_BYTES, 10**6 * BLOCK_BYTES) == 21


def test_too_small_a_device_budget_names_what_to_raise():
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        num_kv_blocks(config(), BLOCK_BYTES, device_bytes=8 * BLOCK_BYTES)


def test_the_cpu_measures_nothing_and_keeps_its_default():
    assert platform_for("cpu").kv_cache_bytes(config(), None) is None
    big = EngineConfig(max_model_len=4096, max_num_seqs=256)
    assert num_kv_blocks(big, BLOCK_BYTES) == DEFAULT_KV_BYTES // BLOCK_BYTES + 1


@pytest.mark.parametrize("bad", [0, -0.1, 1.5, float("nan"), "0.5", True])
def test_gpu_memory_utilization_outside_zero_one_is_refused(bad):
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        EngineConfig(gpu_memory_utilization=bad)


def test_auto_dtype_is_bfloat16_on_cuda_and_keeps_gguf_weights_only_on_the_cpu():
    import torch

    assert EngineConfig(device="cuda").torch_dtype == torch.bfloat16
    assert EngineConfig(device="cpu").torch_dtype == torch.float32
    assert EngineConfig(device="cuda:0", dtype="float64").torch_dtype == torch.float64
    assert EngineConfig(device="cpu").keeps_quantized_weights
    assert not EngineConfig(device="cuda").keeps_quantized_weights
