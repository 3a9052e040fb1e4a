"""`Linear`: `nn.Linear` plus the fused forms the decoder layers use; `Embedding`; and
`load_shard`, which loads one part of a fused weight.

Neither initializes its weights: every weight of a served model is loaded from its
checkpoint (the builder fails on a missing one), and random init of a large matrix costs
seconds at start. Their memory is uninitialized until loaded.

`silu(x)`, `mul(x, other)` and `add(x, other)` compute `silu(x W^T + b)`,
`(x W^T + b) * other` and `(x W^T + b) + other`. Here they are plain torch;
a platform may swap in a subclass that fuses the element-wise part into the
GEMM (the CPU platform's oneDNN `PackedLinear`), so the model code is the same
everywhere.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Linear):
    def __init__(
        self, n_in: int, n_out: int, bias: bool = True, dtype: torch.dtype | None = None
    ) -> None:
        super().__init__(n_in, n_out, bias=bias, dtype=dtype)
        self.requires_grad_(False)

    def reset_parameters(self) -> None:
        """No init: the weights are loaded."""

    def silu(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(self(x))

    def mul(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        return self(x).mul_(other)

    def add(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        return self(x).add_(other)


class KernelForms:
    """`forward`, `silu`, `mul` and `add` of a layer whose `_run(x, op, other)` computes all
    four in one kernel call (its epilogue: `QuantizedLinear`, `PanelLinear`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x, "none", None)

    def silu(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x, "silu", None)

    def mul(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        return self._run(x, "mul", other)

    def add(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        return self._run(x, "add", other)


def apply_form(y: torch.Tensor, op: str, other: torch.Tensor | None) -> torch.Tensor:
    """The element-wise part of a form ("none", "silu", "mul", "add") applied to `y`, the
    product (a kernel layer's fallback path)."""
    if op == "silu":
        return F.silu(y)
    if op == "mul":
        return y.mul_(other)
    if op == "add":
        return y.add_(other)
    return y


class Embedding(nn.Embedding):
    def __init__(self, num: int, dim: int, dtype: torch.dtype | None = None) -> None:
        super().__init__(num, dim, dtype=dtype)
        self.requires_grad_(False)

    def reset_parameters(self) -> None:
        """No init: the weights are loaded."""


def load_shard(param: torch.Tensor, shard: torch.Tensor, offset: int) -> None:
    """Copy one part of a fused weight (q of qkv, gate of gate_up…) into rows [offset, offset+n)."""
    rows = shard.shape[0]
    if offset + rows > param.shape[0] or shard.shape[1:] != param.shape[1:]:
        raise ValueError(
            f"weight shape {tuple(shard.shape)} does not fit fused parameter "
            f"{tuple(param.shape)} at row {offset}"
        )
    param[offset : offset + rows].copy_(shard)
