"""RMSNorm: the C kernel (float32 rows on CPU) against the torch formula, and a row's
result the same alone and in any batch (on both sides of the kernel's threading)."""

from __future__ import annotations

import pytest
import torch

from omnistage import kernels
from omnistage.layers.norm import RMSNorm

needs_kernels = pytest.mark.skipif(kernels.load() is None, reason="no C compiler here")


def _reference(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    x64 = x.double()
    return (
        norm.weight.double() * x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + norm.eps)
    ).to(x.dtype)


@needs_kernels
@pytest.mark.parametrize("rows", [1, 3, 63, 64, 130])
def test_kernel_matches_the_formula_and_is_batch_invariant(rows):
    torch.manual_seed(rows)
    norm = RMSNorm(576, 1e-5, torch.float32)
    norm.weight.normal_()
    x = torch.randn(rows, 576) * 3
    got = norm(x)
    torch.testing.assert_close(got, _reference(norm, x), rtol=1e-5, atol=1e-5)
    for r in {0, rows // 2, rows - 1}:
        assert torch.equal(norm(x[r : r + 1]), got[r : r + 1])


def test_other_dtypes_and_strided_inputs_take_the_torch_path():
    norm64 = RMSNorm(64, 1e-6, torch.float64)
    x = torch.randn(5, 64, dtype=torch.float64)
    torch.testing.assert_close(norm64(x), _reference(norm64, x), rtol=1e-12, atol=1e-12)
    norm = RMSNorm(64, 1e-6, torch.float32)
    strided = torch.randn(64, 10)[:, :1].t().expand(3, 64)  # not contiguous
    torch.testing.assert_close(norm(strided), _reference(norm, strided), rtol=1e-5, atol=1e-5)
