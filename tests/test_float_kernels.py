"""float32 linears on the C kernels (`platforms/cpu_float_kernels.py`): which layers a model
that asks for it gets converted, over the same bytes, with the same results."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from omnistage import kernels
from omnistage.layers.decode_program import DISABLE_ENV
from omnistage.layers.ggml_types import GGMLType
from omnistage.layers.linear import Linear
from omnistage.layers.quantized_linear import QuantizedLinear
from omnistage.platforms.cpu import CpuPlatform
from omnistage.platforms.cpu_float_kernels import linears_on_float_kernels, wants_float_kernels

needs_kernels = pytest.mark.skipif(kernels.load_quant() is None, reason="no C compiler")


class _OwnWeights(nn.Module):
    """A part that reads its weights itself (as the code predictor's C step does)."""

    keeps_plain_linears = True

    def __init__(self) -> None:
        super().__init__()
        self.proj = Linear(64, 64, bias=False)


class _Talker(nn.Module):
    float_linears_on_kernels = True

    def __init__(self) -> None:
        super().__init__()
        self.qkv = Linear(64, 96, bias=True)
        self.down = Linear(96, 64, bias=False)
        self.odd = Linear(48, 64, bias=False)  # not a multiple of 32 wide
        self.wide = Linear(64, 32, bias=False, dtype=torch.float64)
        self.head = nn.Linear(64, 300, bias=False)
        self.own = _OwnWeights()
        g = torch.Generator().manual_seed(0)
        for p in self.parameters():
            p.data.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))


@needs_kernels
def test_float32_linears_become_f32_kernels_over_the_same_bytes():
    model = _Talker()
    before = {
        n: (m.weight.data_ptr(), m.weight.clone(), m.bias)
        for n, m in model.named_children()
        if isinstance(m, nn.Linear)
    }
    assert linears_on_float_kernels(model) == 3
    for name in ("qkv", "down", "head"):
        layer = getattr(model, name)
        assert isinstance(layer, QuantizedLinear) and layer.ggml_type == GGMLType.F32
        ptr, weight, bias = before[name]
        assert layer.blocks.data_ptr() == ptr  # no copy
        for rows in (1, 5, 70):
            x = torch.randn(rows, weight.shape[1], generator=torch.Generator().manual_seed(rows))
            ref = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
            torch.testing.assert_close(layer(x).double(), ref, atol=1e-5, rtol=1e-5)
    x = torch.randn(3, 64)
    other = torch.randn(3, 96)
    torch.testing.assert_close(model.qkv.silu(x), F.silu(model.qkv(x)))
    torch.testing.assert_close(model.qkv.mul(x, other), model.qkv(x) * other)
    for kept in (model.odd, model.wide, model.own.proj):
        assert type(kept) is Linear


@needs_kernels
def test_only_models_that_ask_get_them(monkeypatch):
    talker = _Talker()
    assert wants_float_kernels(talker)
    plain = nn.Sequential(Linear(64, 64, bias=False))
    assert not wants_float_kernels(plain)
    CpuPlatform().prepare_model(plain)
    assert not any(isinstance(m, QuantizedLinear) for m in plain.modules())
    monkeypatch.setenv(DISABLE_ENV, "1")
    assert not wants_float_kernels(talker)


@needs_kernels
def test_the_cpu_platform_converts_before_packing():
    model = CpuPlatform().prepare_model(_Talker())
    assert isinstance(model.qkv, QuantizedLinear) and isinstance(model.head, QuantizedLinear)
    assert type(model.own.proj) is Linear  # the C step's own weights stay plain
