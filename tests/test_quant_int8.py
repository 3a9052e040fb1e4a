"""The int8 path of the quantized linears: x quantized to 8 bits per 32-block, integer dots.

Reference: the float64 product with gguf's dequantized weights. The int8 path's
outputs are within `INT8_TOLERANCE` (1e-2) of the output's scale (its largest
absolute value) from it; ~7e-3 is the worst measured over these shapes and seeds.
The paths (portable C, AVX2, AVX-512 VNNI) compute the same float operations in the
same order on exact integer dot products, so they are compared bit for bit, and a
row's output is bit-identical alone and in any batch (the float32 path keeps its own
tests in test_quantized_linear.py).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as T

from omnistage import kernels
from omnistage.kernels import work_sharing
from omnistage.layers import quant_paths
from omnistage.layers import quantized_linear as QL
from tests.test_quantized_linear import assert_close_to_scale, make_layer

TYPES = [T.Q4_0, T.Q4_1, T.Q8_0, T.Q4_K, T.Q6_K]
PATHS = {"scalar": kernels.ISA_SCALAR, "avx2": kernels.ISA_AVX2, "avx512": kernels.ISA_AVX512}
N_ODD = 37  # not a multiple of the kernels' 4-row tiles nor of their 16-row units

lib = kernels.load_quant()
needs_kernels = pytest.mark.skipif(lib is None, reason="no C compiler on this machine")


def path_param(name):
    """The int8 kernels of level `name`, skipped where this CPU does not run them (AVX-512
    counts only with VNNI: without it the level runs the AVX2 kernels)."""
    level = PATHS[name]
    missing = lib is None or lib.quant_q8_isa(level) != level
    return pytest.param(level, id=name, marks=pytest.mark.skipif(missing, reason=name))


ALL_PATHS = [path_param(n) for n in PATHS]


def int8_layer(ggml_type, n, k, isa=kernels.ISA_AVX512, bias=False, seed=0):
    layer, weight, b = make_layer(ggml_type, n, k, bias=bias, isa=isa, seed=seed)
    layer.activations = "int8"
    return layer, weight, b


def k_values(ggml_type):
    """K: one block, a few (not a multiple of 256 where the format allows), SmolLM2's."""
    return [256, 512, 1536] if ggml_type in (T.Q4_K, T.Q6_K) else [32, 160, 576]


@needs_kernels
@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_int8_matches_the_dequantized_product(ggml_type):
    for k in k_values(ggml_type):
        layer, weight, bias = int8_layer(ggml_type, N_ODD, k, bias=True, seed=k)
        for m in (1, 37, 64):
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m + k))
            ref = x.double() @ weight.T + bias.double()
            assert_close_to_scale(layer(x), ref, quant_paths.INT8_TOLERANCE)


@needs_kernels
@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_every_path_gives_the_same_bits(ggml_type):
    """Portable C, AVX2 and AVX-512 VNNI: the same outputs bit for bit, fused forms too."""
    k = k_values(ggml_type)[1]
    layer, _, _ = int8_layer(ggml_type, N_ODD, k, bias=True, seed=1)
    g = torch.Generator().manual_seed(2)
    x, other = torch.randn(37, k, generator=g), torch.randn(37, N_ODD, generator=g)
    outputs = {}
    for name, level in PATHS.items():
        layer.isa = level
        outputs[name] = [layer(x), layer.silu(x), layer.mul(x, other), layer.add(x, other)]
    for name, outs in outputs.items():
        for out, first in zip(outs, outputs["scalar"], strict=True):
            assert torch.equal(out, first), name


@needs_kernels
@pytest.mark.parametrize("isa", ALL_PATHS)
@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_a_row_is_the_same_alone_and_in_any_batch(ggml_type, isa):
    k = k_values(ggml_type)[1]
    layer, _, _ = int8_layer(ggml_type, N_ODD, k, isa=isa, bias=True, seed=5)
    x = torch.randn(64, k, generator=torch.Generator().manual_seed(6))
    full = layer.silu(x)
    for i in range(64):
        assert torch.equal(layer.silu(x[i : i + 1])[0], full[i])
    for m in range(1, 65):
        start = (7 * m) % (65 - m)
        assert torch.equal(layer.silu(x[start : start + m]), full[start : start + m])


@needs_kernels
@pytest.mark.parametrize("torch_threads", [1, 2])
def test_threads_share_the_rows(monkeypatch, torch_threads):
    """Helper threads (each quantizing x itself) or torch's OpenMP team (x quantized once):
    every output bit for bit as on one thread."""
    layer, _, _ = int8_layer(T.Q4_1, 300, 256, bias=True)
    x = torch.randn(5, 256)
    alone = layer.silu(x)
    monkeypatch.setattr(QL, "PARALLEL_WEIGHT_BYTES", 0)
    before = torch.get_num_threads()
    torch.set_num_threads(torch_threads)
    work_sharing.set_num_threads(3)
    try:
        for _ in range(5):
            assert torch.equal(layer.silu(x), alone)
    finally:
        torch.set_num_threads(before)
        work_sharing.set_num_threads(work_sharing.available_cores())


@needs_kernels
def test_large_inputs_take_the_heap():
    """x beyond the kernels' stack buffer (64 KB quantized) on one thread and on a team."""
    layer, weight, _ = int8_layer(T.Q8_0, 40, 2048)
    x = torch.randn(40, 2048, generator=torch.Generator().manual_seed(3))
    out = layer(x)
    assert_close_to_scale(out, x.double() @ weight.T, quant_paths.INT8_TOLERANCE)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert torch.equal(layer(x), out)
    finally:
        torch.set_num_threads(before)


@needs_kernels
def test_the_path_is_chosen_by_argument_environment_or_type(monkeypatch):
    monkeypatch.delenv(quant_paths.ACTIVATIONS_ENV, raising=False)
    layer, weight, _ = make_layer(T.Q4_1, 16, 64)
    assert layer.activations == "float32"  # the default
    x = torch.randn(3, 64)
    assert_close_to_scale(layer(x), x.double() @ weight.T)  # the float path's 2e-5
    monkeypatch.setenv(quant_paths.ACTIVATIONS_ENV, "int8")
    assert make_layer(T.Q4_1, 16, 64)[0].activations == "int8"  # T.Q4_1 is in INT8_TYPES
    monkeypatch.setenv(quant_paths.ACTIVATIONS_ENV, "float32")
    blocks = layer.blocks
    assert QL.QuantizedLinear(blocks, T.Q4_1, 64, 16, activations="int8").activations == "int8"
    monkeypatch.setenv(quant_paths.ACTIVATIONS_ENV, "int4")
    with pytest.raises(ValueError, match=quant_paths.ACTIVATIONS_ENV):
        make_layer(T.Q4_1, 16, 64)
    with pytest.raises(ValueError, match="activations"):
        QL.QuantizedLinear(blocks, T.Q4_1, 64, 16, activations="bf16")


def test_inputs_the_kernel_does_not_take_use_the_exact_fallback():
    """float64 (or no library): dequantize and F.linear, whatever the path."""
    layer, weight, bias = make_layer(T.Q4_1, 20, 64, bias=True)
    layer.activations = "int8"
    x = torch.randn(4, 64, dtype=torch.float64)
    expected = F.linear(x, weight, bias.double())
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=1e-12)


@needs_kernels
def test_the_engine_argument_picks_the_path_of_every_quantized_layer(monkeypatch):
    """`quant_activations` reaches every kept quantized layer (a tied LM head too); the
    default is the float path, and a bad value is a ValueError naming the field."""
    from omnistage import LLM
    from omnistage.config import EngineConfig

    monkeypatch.delenv(quant_paths.ACTIVATIONS_ENV, raising=False)
    with pytest.raises(ValueError, match="quant_activations"):
        EngineConfig(quant_activations="int4")
    for asked, expected in ((None, "float32"), ("int8", "int8"), ("float32", "float32")):
        llm = LLM("smollm2", async_scheduling=False, quant_activations=asked)
        model = llm.engine.core.executor.runner.model
        paths = {m.activations for m in model.modules() if isinstance(m, QL.QuantizedLinear)}
        assert paths == {expected}, asked
        assert isinstance(model.lm_head, QL.QuantizedLinear)
