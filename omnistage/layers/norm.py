"""RMS normalisation, computed in at least float32 as transformers computes it; float32
rows on CPU in one C call (`kernels/rms_norm.c`) where the kernels are built."""

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
        if (
            x.dtype == torch.float32
            and self.weight.dtype == torch.float32
            and x.device.type == "cpu"
            and x.is_contiguous()
            and x.shape[-1] == self.weight.shape[0]
        ):
            lib = kernels.load()
            if lib is not None:
                out = torch.empty_like(x)
                lib.rms_norm_f32(
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
