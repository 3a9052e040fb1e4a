"""Linear layers with weights pre-packed for oneDNN, the CPU GEMM that torch's inductor uses.

MKL's sgemm (behind `F.linear`) repacks the weight matrix on every call; at
decode batch sizes that costs as much as the multiply. Packing each weight
once at load time makes a real model's linears 1.3-2x faster on CPU
(the LM head most), and oneDNN post-ops fuse the SiLU, the gate product and
the residual adds into the GEMMs. A small float32 one stays plain: oneDNN's
call costs more than its product (`PACK_MIN_WEIGHTS`). Packing is only done for dtypes oneDNN
supports; float64 keeps plain `F.linear` (exact equivalence tests run there).
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

import torch
from torch import nn

from omnistage import kernels
from omnistage.layers.linear import Linear
from omnistage.layers.panel_linear import PanelLinear

logger = logging.getLogger("omnistage")

PACKABLE_DTYPES = (torch.float32, torch.bfloat16)

F32_LINEARS_ENV = "OMNISTAGE_F32_LINEARS"
"""`panels` (the default where it applies) or `onednn`: the GEMM of float32 linears."""


PACK_MIN_WEIGHTS = 1 << 17
"""A float32 `Linear` with fewer weights stays plain `F.linear`: oneDNN's call costs
~15-20 us whatever the size, which is most of a small product (measured, one thread, Zen 4,
float32: 48x144 at 16 rows 23 us packed against 6 us plain, 128x512 53 against 39,
256x256 35 against 30, but 256x1024 95 against 117 and 576x576 116 against 142; at 256 rows
the small ones are even, docs/performance.md). A tiny model's every linear is under it."""
BF16_PACKING_CPU_FLAGS = ("avx512bw", "avx_ne_convert", "amx_bf16")
"""oneDNN reorders bf16 weights only on CPUs with one of these (else it raises in
`_reorder_linear_weight`): Zen 4 and recent Intel have them, Zen 2 (AVX2 only) does not."""


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where it cannot be read)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def packable_dtypes(flags: frozenset[str] | None = None) -> tuple[torch.dtype, ...]:
    """The weight dtypes oneDNN can pack on this CPU (`flags`: its feature flags)."""
    flags = cpu_flags() if flags is None else flags
    if any(f in flags for f in BF16_PACKING_CPU_FLAGS):
        return PACKABLE_DTYPES
    return (torch.float32,)


class PackedLinear(Linear):
    """A `Linear` whose weight lives in oneDNN's packed layout."""

    def __init__(self, linear: nn.Linear) -> None:
        nn.Module.__init__(self)
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")

    def silu(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "swish", [], "")

    def mul(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise.binary(
            x, other, self.packed_weight, self.bias, "mul"
        )

    def add(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise.binary(
            x, other, self.packed_weight, self.bias, "add"
        )


def pack_linears(model: nn.Module) -> int:
    """Replace every `nn.Linear` of `model` by a `PackedLinear` (but inside a module whose
    `keeps_plain_linears` is true, and float32 ones under `PACK_MIN_WEIGHTS` weights);
    returns how many were packed."""
    if not onednn_available():
        return 0
    dtypes = packable_dtypes()
    if torch.bfloat16 not in dtypes and _has_linear(model, torch.bfloat16):
        logger.info(
            "bfloat16 linears stay unpacked (plain F.linear): this CPU has none of %s, "
            "which oneDNN's bf16 weight packing needs",
            ", ".join(BF16_PACKING_CPU_FLAGS),
        )
    # A part that reads its weights itself (`keeps_plain_linears`: the code predictor's C
    # step, layers/dense_step.py) keeps them as they are.
    own = {
        id(m)
        for part in model.modules()
        if getattr(part, "keeps_plain_linears", False)
        for m in part.modules()
    }
    targets = [
        (parent, name, child)
        for parent in model.modules()
        if id(parent) not in own
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear)
        and not isinstance(child, PackedLinear)
        and child.weight.dtype in dtypes
        and (child.weight.dtype != torch.float32 or child.weight.numel() >= PACK_MIN_WEIGHTS)
    ]
    panels = float32_panels()
    for parent, name, child in targets:
        if panels and child.weight.dtype == torch.float32:
            setattr(parent, name, PanelLinear(child))
        else:
            setattr(parent, name, PackedLinear(child))
    if targets:
        kind = "column panels / oneDNN" if panels else "oneDNN"
        logger.info("packed %d linear layers (%s)", len(targets), kind)
    return len(targets)


def float32_panels() -> bool:
    """Whether float32 linears take our column-panel kernel (`layers/panel_linear.py`)
    rather than oneDNN: on AVX-512 CPUs with the kernels built, unless
    `OMNISTAGE_F32_LINEARS=onednn` says otherwise."""
    choice = os.environ.get(F32_LINEARS_ENV, "panels")
    if choice not in ("panels", "onednn"):
        raise ValueError(f"{F32_LINEARS_ENV}: expected panels or onednn, got {choice!r}")
    lib = kernels.load_quant() if choice == "panels" else None
    return lib is not None and lib.quant_best_isa() >= kernels.ISA_AVX512


def _has_linear(model: nn.Module, dtype: torch.dtype) -> bool:
    return any(isinstance(m, nn.Linear) and m.weight.dtype == dtype for m in model.modules())
