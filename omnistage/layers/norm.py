"""RMS normalisation, computed in at least float32 as transformers computes it; float32
and bfloat16 rows on CPU in one C call (`kernels/rms_norm.c`) where the kernels are built,
and so is `qk_norm_in_place`, Qwen3's per-head RMSNorm of q and k inside the qkv
projection's rows."""

from __future__ import annotations

import torch
from torch import nn

from omnistage import kernels


class RMSNorm(nn.Module):
    """RMS normalisation, computed in at least float32 (as transformers does)."""

    def __init__(self, size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype), requires_grad=False)
        self.eps = eps
        self.compute_dtype = torch.float64 if dtype == torch.float64 else torch.float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        suffix = kernels.kernel_suffix(x, self.weight)
        if suffix is not None and x.is_contiguous() and x.shape[-1] == self.weight.shape[0]:
            lib = kernels.load()
            if lib is not None:
                out = torch.empty_like(x)
                getattr(lib, f"rms_norm_{suffix}")(
                    x.data_ptr(),
                    self.weight.data_ptr(),
                    out.data_ptr(),
                    x.numel() // x.shape[-1],
                    x.shape[-1],
                    self.eps,
                    torch.get_num_threads(),
                )
                return out
        dtype = x.dtype
        x = x.to(self.compute_dtype)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def qk_norm_in_place(
    qkv: torch.Tensor, q_norm: RMSNorm, k_norm: RMSNorm, heads: int, kv_heads: int
) -> bool:
    """Normalise each of the `heads` q heads (by `q_norm`) and `kv_heads` k heads (by
    `k_norm`) at the start of every row of `qkv` [T, width] in place, in one C call
    (`qk_norm_f32` / `_bf16`: one row function per head, so a row's result is the same
    alone or in any batch). Returns False, having done nothing, where that call does not
    apply (not float32 or bfloat16 rows and weights on CPU, no kernels here): the caller
    then normalises with the modules themselves."""
    head_dim = q_norm.weight.shape[0]
    suffix = kernels.kernel_suffix(qkv, q_norm.weight, k_norm.weight)
    if not (
        suffix is not None
        and type(q_norm) is RMSNorm
        and type(k_norm) is RMSNorm
        and q_norm.eps == k_norm.eps
        and qkv.dim() == 2
        and qkv.is_contiguous()
        and qkv.shape[1] >= (heads + kv_heads) * head_dim
        and all(n.weight.shape == (head_dim,) for n in (q_norm, k_norm))
    ):
        return False
    lib = kernels.load()
    if lib is None:
        return False
    getattr(lib, f"qk_norm_{suffix}")(
        qkv.data_ptr(),
        qkv.shape[0],
        qkv.shape[1],
        heads,
        kv_heads,
        head_dim,
        q_norm.weight.data_ptr(),
        k_norm.weight.data_ptr(),
        q_norm.eps,
        torch.get_num_threads(),
    )
    return True
