"""`PanelLinear`: a float32 `Linear` whose weight is repacked into column panels for our C
kernel (`kernels/panel_matmul.c`).

The weight [N, K] becomes ceil(N / 64) panels of K rows of 64 floats (the last zero-padded:
resident memory is the weight's, up to 63 columns); the product is an outer-product
register tile over a panel, every output one float32 fused multiply-add chain in k order,
so a row's result is the same alone or in any batch, and the AVX-512 and portable paths
agree bit for bit. `silu(x)`, `mul(x, other)` and `add(x, other)` are fused into the
kernel's epilogue, as `Linear`'s forms say. Inputs the kernel does not take (not float32
on the CPU, another width) go through `F.linear` on the unpacked weight.

Chosen by the CPU platform for a checkpoint's float32 linears on AVX-512 machines
(`platforms/cpu_linear.py`); an AVX2 machine keeps oneDNN's packed GEMM (not measured
there).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omnistage import kernels
from omnistage.layers.linear import KernelForms, Linear, apply_form
from omnistage.layers.quant_paths import KernelCall, call_matmul, isa_level, kernel_address
from omnistage.layers.quantized_linear import EPILOGUE_OPS, PARALLEL_WEIGHT_BYTES

PANEL = 64
"""Output columns a panel (`PANEL` of `kernels/panel_matmul.c`)."""
KERNELS = ("panel_matmul_f32", "panel_matmul_f32_team")
"""The work-sharing product and its OpenMP twin in `kernels.load_quant()`."""


class PanelLinear(KernelForms, Linear):
    """`y = x W^T + b` on W repacked into column panels (see the module docstring)."""

    def __init__(self, linear: nn.Linear, isa: int | None = None) -> None:
        nn.Module.__init__(self)
        lib = kernels.load_quant()
        if lib is None:
            raise ValueError("PanelLinear: the C kernels are not built here")
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        weight = linear.weight.detach().float().contiguous()
        panels = -(-self.out_features // PANEL)
        self.register_buffer("panels", torch.empty(panels * self.in_features * PANEL))
        lib.panel_pack_f32(
            weight.data_ptr(), self.out_features, self.in_features, self.panels.data_ptr()
        )
        bias = linear.bias
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())
        self.isa = isa_level(isa)

    def kernel_call(self) -> KernelCall | None:
        """What a decode program (`layers/decode_program.py`) needs to run this product in C
        on float32 rows: the same kernel and arguments as `forward`."""
        lib = kernels.load_quant()
        if lib is None:
            return None
        bias = self._buffers["bias"]
        return KernelCall(
            kernel=kernel_address(lib, KERNELS[0]),
            weight=self._buffers["panels"].data_ptr(),
            bias=None if bias is None else bias.data_ptr(),
            type_id=0,
            isa=self.isa,
        )

    def unpacked_weight(self) -> torch.Tensor:
        """W [out_features, in_features] from the panels (for the fallback and tests)."""
        k = self.in_features
        w = self.panels.view(-1, k, PANEL).transpose(1, 2).reshape(-1, k)
        return w[: self.out_features]

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, panels of {PANEL}"
        )

    def _run(self, x: torch.Tensor, op: str, other: torch.Tensor | None) -> torch.Tensor:
        out_shape = (*x.shape[:-1], self.out_features)
        if (
            x.dtype != torch.float32
            or x.device.type != "cpu"
            or x.shape[-1] != self.in_features
            or (other is not None and (other.dtype != torch.float32 or other.shape != out_shape))
        ):
            return self._fallback(x, op, other)
        x2 = (x if x.dim() == 2 else x.reshape(-1, self.in_features)).contiguous()
        m = x2.shape[0]
        y = torch.empty(m, self.out_features)
        if m:
            if other is not None:
                other = (other if other.dim() == 2 else other.reshape(y.shape)).contiguous()
            buffers = self._buffers
            bias = buffers["bias"]
            args = (
                x2.data_ptr(),
                buffers["panels"].data_ptr(),
                None if bias is None else bias.data_ptr(),
                None if other is None else other.data_ptr(),
                y.data_ptr(),
                m,
                self.out_features,
                self.in_features,
                0,
                EPILOGUE_OPS[op],
                self.isa,
            )
            parallel = 4 * self.panels.numel() * m >= PARALLEL_WEIGHT_BYTES
            call_matmul(kernels.load_quant(), *KERNELS, args, parallel)
        return y if x.dim() == 2 else y.reshape(out_shape)

    def _fallback(self, x: torch.Tensor, op: str, other: torch.Tensor | None) -> torch.Tensor:
        weight = self.unpacked_weight().to(x.device, x.dtype)
        bias = None if self.bias is None else self.bias.to(x.device, x.dtype)
        return apply_form(F.linear(x, weight, bias), op, other)
