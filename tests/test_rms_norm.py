"""RMSNorm: the C kernel (float32 rows on CPU) against the torch formula, and a row's
result the same alone and in any batch (on both sides of the kernel's threading); the
same for Qwen3's per-head q/k norm inside qkv rows (`qk_norm_in_place`)."""

from __future__ import annotations

import pytest
import torch

from omnistage import kernels
from omnistage.layers.norm import RMSNorm, qk_norm_in_place

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


HEADS, KV_HEADS, HEAD_DIM = 4, 2, 32


def _qk_norms(dtype: torch.dtype = torch.float32) -> tuple[RMSNorm, RMSNorm]:
    q_norm, k_norm = RMSNorm(HEAD_DIM, 1e-6, dtype), RMSNorm(HEAD_DIM, 1e-6, dtype)
    q_norm.weight.normal_()
    k_norm.weight.normal_()
    return q_norm, k_norm


def _split(qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The q, k heads ([T, heads, d] strided views, as the layer path has them) and v."""
    q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
    return q.view(-1, HEADS, HEAD_DIM), k.view(-1, KV_HEADS, HEAD_DIM), v


@needs_kernels
@pytest.mark.parametrize("rows", [1, 3, 64, 130])
def test_qk_norm_kernel_matches_torch_and_is_batch_invariant(rows):
    """In place on strided rows: q and k heads equal torch's RMSNorm of the same views within
    1e-6 relative (and equal bit for bit the row kernel on the heads copied out), v is left
    alone, and a row gives the same bits alone as in the batch (threaded from 64 rows)."""
    torch.manual_seed(rows)
    q_norm, k_norm = _qk_norms()
    qkv = torch.randn(rows, (HEADS + 2 * KV_HEADS) * HEAD_DIM) * 3
    q, k, v = _split(qkv)
    expected_q, expected_k = q_norm(q), k_norm(k)  # strided: torch's formula
    one_call_q = q_norm(q.reshape(-1, HEAD_DIM).contiguous()).view_as(q)  # the row kernel
    got = qkv.clone()
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert qk_norm_in_place(got, q_norm, k_norm, HEADS, KV_HEADS)
    finally:
        torch.set_num_threads(previous)
    got_q, got_k, got_v = _split(got)
    torch.testing.assert_close(got_q, expected_q, rtol=1e-6, atol=0)
    torch.testing.assert_close(got_k, expected_k, rtol=1e-6, atol=0)
    assert torch.equal(got_q, one_call_q)
    assert torch.equal(got_v, v)
    assert not torch.equal(got_q, q)
    for r in {0, rows // 2, rows - 1}:
        alone = qkv[r : r + 1].clone()
        assert qk_norm_in_place(alone, q_norm, k_norm, HEADS, KV_HEADS)
        assert torch.equal(alone, got[r : r + 1])


def test_qk_norm_refuses_what_the_kernel_does_not_take(monkeypatch):
    """float64 rows or weights, non-contiguous rows and a machine without the kernels:
    nothing done, False (the caller normalises with torch)."""
    norms64 = _qk_norms(torch.float64)
    width = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    qkv64 = torch.randn(3, width, dtype=torch.float64)
    assert not qk_norm_in_place(qkv64.clone(), *norms64, HEADS, KV_HEADS)
    norms = _qk_norms()
    strided = torch.randn(width, 3).t()
    before = strided.clone()
    assert not qk_norm_in_place(strided, *norms, HEADS, KV_HEADS)
    assert torch.equal(strided, before)
    assert not qk_norm_in_place(qkv64.float(), *norms64, HEADS, KV_HEADS)
    rows = torch.randn(3, width)
    before = rows.clone()
    monkeypatch.setattr(kernels, "load", lambda: None)
    assert not qk_norm_in_place(rows, *norms, HEADS, KV_HEADS)
    assert torch.equal(rows, before)
