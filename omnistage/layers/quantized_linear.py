"""`QuantizedLinear` and `QuantizedEmbedding`: weights kept in GGUF's quantized blocks.

A GGUF file stores a matrix [N, K] as N rows of K / block_elems ggml blocks
(Q4_0, Q4_1, Q8_0, Q4_K, Q6_K, ...; F32, F16 and BF16 rows, which the kernels read
as blocks of 32 values without a scale). These modules hold those bytes unchanged,
as a uint8 tensor [N, row_bytes], so resident weight memory is the file's size
and a batch-1 decode step reads the packed bytes instead of float32 (SmolLM2-
135M: 85 MB per token instead of 540 MB).

Products run in the C kernels, on one of two paths (`activations`):
- "float32" (the default): W dequantized to float32 in registers or L1 against float32
  activations (`kernels/quant_matmul.c`), the float32 product up to summation
  order (~1e-6 of the output scale);
- "int8" (asked for; `quant_paths.INT8_TYPES`): each row of x is quantized to 8 bits per
  32-block and multiplied by integer dot products (`kernels/quant_matmul_q8.c`, as
  llama.cpp): up to ~1 % of the output scale from the float32 product with the
  dequantized weight (`quant_paths.INT8_TOLERANCE`), bit for bit the same on every instruction
  set. ~10 % faster decode of SmolLM2 Q4_1 end to end on Zen 4, but its greedy text
  can differ from the float path's (docs/performance.md), so it is not the default.
Both are batch-invariant: a row's output is the same alone or in any batch.
Where no kernel applies — no C compiler, a ggml type it does not know, an input
that is not float32 on the CPU — the weight is dequantized for the call and
`F.linear` runs instead (slow, for tests and fallbacks; `dequantize()` is also
what float-dtype loading uses).

`OMNISTAGE_QUANT_ISA` (`scalar`, `avx2`, `avx512`) caps the instruction set the
kernels use, as the `isa` argument does, and `OMNISTAGE_QUANT_ACTIVATIONS`
(`int8`, `float32`) picks the path, as the `activations` argument does; both are
read when a layer is built, and tests run every path on one machine with them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from omnistage.layers.ggml_types import BLOCK_SIZES, GGMLType
from omnistage.layers.linear import KernelForms, apply_form
from omnistage.layers.quant_paths import (
    ACTIVATIONS,
    FLOAT_KERNEL_BLOCK,
    FLOAT_KERNEL_TYPES,
    INT8_TYPES,
    KERNEL_FUNCTIONS,
    KernelCall,
    activation_path,
    bump_path_generation,
    call_matmul,
    isa_level,
    kernel_address,
    kernel_library,
)

PARALLEL_WEIGHT_BYTES = 1 << 18
"""Weight bytes times rows of x from which a product is split between threads. Measured
on Zen 4 (2 cores, batch 1, Q4_1): SmolLM2's 576->1536 (553 KB) runs 1.5x faster on two
threads; 576->576 (207 KB, ~35 us) gains nothing, 576->192 (69 KB) loses."""


EPILOGUE_OPS = {"none": 0, "silu": 1, "mul": 2, "add": 3}
"""The kernels' epilogue ops by name (`op` of `quant_matmul_f32`)."""


def row_bytes(ggml_type: GGMLType, in_features: int) -> int:
    """Bytes of one row of `in_features` values stored as `ggml_type`."""
    block_elems, block_bytes = BLOCK_SIZES[ggml_type]
    if ggml_type in FLOAT_KERNEL_TYPES and in_features % FLOAT_KERNEL_BLOCK:
        raise ValueError(
            f"in_features: {in_features} is not a multiple of {FLOAT_KERNEL_BLOCK}, "
            f"which the kernels need for a {ggml_type.name} matrix"
        )
    if in_features % block_elems:
        raise ValueError(
            f"in_features: {in_features} is not a multiple of {ggml_type.name}'s "
            f"block of {block_elems} values"
        )
    return in_features // block_elems * block_bytes


def _as_uint8(data: Any) -> torch.Tensor:
    """`data`'s bytes as a flat uint8 tensor: a tensor is viewed, anything else copied."""
    if isinstance(data, torch.Tensor):
        return data.detach().contiguous().view(torch.uint8).reshape(-1)
    array = np.ascontiguousarray(np.frombuffer(data, np.uint8) if isinstance(data, bytes) else data)
    return torch.from_numpy(array.view(np.uint8).reshape(-1).copy())


class _QuantizedMatrix(nn.Module):
    """A matrix [rows, cols] held as the uint8 buffer `blocks` [rows, row_bytes]."""

    def __init__(
        self,
        blocks: torch.Tensor,
        ggml_type: GGMLType,
        rows: int,
        cols: int,
        isa: int | None = None,
    ) -> None:
        super().__init__()
        self.ggml_type = GGMLType(ggml_type)
        if self.ggml_type not in BLOCK_SIZES:
            raise ValueError(f"ggml_type: unknown type {ggml_type}")
        expected = (rows, row_bytes(self.ggml_type, cols))
        if blocks.dtype != torch.uint8 or blocks.numel() != expected[0] * expected[1]:
            raise ValueError(
                f"blocks: expected {expected[0] * expected[1]} uint8 bytes for a "
                f"{self.ggml_type.name} matrix [{rows}, {cols}], got {blocks.numel()} {blocks.dtype}"
            )
        self.register_buffer("blocks", blocks.reshape(expected).contiguous())
        self._type_id = int(self.ggml_type)
        self.isa = isa_level(isa)

    def _dequantize_rows(self, rows: torch.Tensor | None, cols: int) -> torch.Tensor:
        """float32 [len(rows), cols]: `rows` (int64, contiguous; None: all) dequantized."""
        lib = kernel_library(self.ggml_type)
        if lib is None or self.blocks.device.type != "cpu":
            if (
                rows is not None
                and rows.numel()
                and not 0 <= rows.min() <= rows.max() < len(self.blocks)
            ):
                raise IndexError(f"row id out of range [0, {len(self.blocks)})")
            picked = self.blocks if rows is None else self.blocks[rows]
            from gguf import quants  # only types without a C kernel come here

            values = quants.dequantize(picked.cpu().numpy(), self.ggml_type)
            return torch.from_numpy(values).reshape(-1, cols).to(self.blocks.device)
        n_rows = len(self.blocks) if rows is None else rows.numel()
        out = torch.empty(n_rows, cols, dtype=torch.float32)
        status = lib.quant_dequantize_rows_f32(
            self.blocks.data_ptr(),
            len(self.blocks),
            cols,
            int(self.ggml_type),
            None if rows is None else rows.data_ptr(),
            n_rows,
            out.data_ptr(),
            self.isa,
        )
        if status != 0:
            raise IndexError(f"row id out of range [0, {len(self.blocks)})")
        return out


class QuantizedLinear(KernelForms, _QuantizedMatrix):
    """`y = x W^T + b` with W [out_features, in_features] in a ggml quantized format.

    The same interface as `models.linear.Linear`: `forward`, and the fused forms
    `silu(x)`, `mul(x, other)`, `add(x, other)` (`silu(x W^T + b)`, `(x W^T + b) *
    other`, `(x W^T + b) + other`), computed in the kernel's epilogue.
    `activations` ("int8" or "float32"; None: see `_activations`) picks the kernel path;
    it may be reassigned (F32, F16 and BF16 matrices stay on "float32").
    """

    def __init__(
        self,
        blocks: torch.Tensor,
        ggml_type: GGMLType,
        in_features: int,
        out_features: int,
        bias: torch.Tensor | None = None,
        isa: int | None = None,
        activations: str | None = None,
    ) -> None:
        super().__init__(blocks, ggml_type, out_features, in_features, isa)
        self.activations = activation_path(activations)
        self.in_features = in_features
        self.out_features = out_features
        if bias is not None and bias.shape != (out_features,):
            raise ValueError(f"bias: expected shape ({out_features},), got {tuple(bias.shape)}")
        # float32 whatever it came as: the kernels' epilogue adds it to float32 sums
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())

    @classmethod
    def from_gguf_bytes(
        cls,
        data: Any,
        ggml_type: GGMLType | int,
        in_features: int,
        out_features: int,
        bias: torch.Tensor | None = None,
    ) -> QuantizedLinear:
        """The layer over a GGUF tensor's raw bytes (bytes, a uint8 numpy array such as
        `gguf.GGUFReader`'s `tensor.data`, copied; or a uint8 tensor, used as is).
        GGUF lists the shape in this order too (ggml's [ne0, ne1]): `*tensor.shape`."""
        return cls(_as_uint8(data), GGMLType(ggml_type), in_features, out_features, bias)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight [out_features, in_features] as floats."""
        return self._dequantize_rows(None, self.in_features).to(dtype)

    @property
    def activations(self) -> str:
        """The kernel path: "int8" (x quantized to 8 bits per block) or "float32"."""
        return self._activations

    @activations.setter
    def activations(self, value: str) -> None:
        if value not in KERNEL_FUNCTIONS:
            raise ValueError(f"activations: expected one of {list(ACTIVATIONS)}, got {value!r}")
        if self.ggml_type not in INT8_TYPES:
            value = "float32"  # float matrices (F32, F16, BF16) have no int8 path
        self._activations = value
        self._kernel_names = KERNEL_FUNCTIONS[value]
        bump_path_generation()

    def kernel_call(self) -> KernelCall | None:
        """What a decode program (`layers/decode_program.py`) needs to run this product in
        C on float32 rows, or None where the fallback would run it."""
        lib = kernel_library(self.ggml_type)
        if lib is None:
            return None
        kernel = kernel_address(lib, self._kernel_names[0])
        buffers = self._buffers
        bias = buffers["bias"]
        return KernelCall(
            kernel=kernel,
            weight=buffers["blocks"].data_ptr(),
            bias=None if bias is None else bias.data_ptr(),
            type_id=self._type_id,
            isa=self.isa,
        )

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"type={self.ggml_type.name}, bias={self.bias is not None}, "
            f"activations={self.activations}"
        )

    def _run(self, x: torch.Tensor, op: str, other: torch.Tensor | None) -> torch.Tensor:
        # Called ~200 times per decode step of a small model: attribute reads of the
        # buffers and reshapes of 2-D inputs are kept off this path.
        lib = kernel_library(self.ggml_type)
        if (
            lib is None
            or x.dtype != torch.float32
            or x.device.type != "cpu"
            or x.shape[-1] != self.in_features
            or (other is not None and other.dtype != torch.float32)
        ):
            return self._fallback(x, op, other)
        out_shape = (*x.shape[:-1], self.out_features)
        if other is not None and other.shape != out_shape:
            return self._fallback(x, op, other)
        x2 = (x if x.dim() == 2 else x.reshape(-1, self.in_features)).contiguous()
        m = x2.shape[0]
        y = torch.empty(m, self.out_features)
        if m:
            buffers = self._buffers
            blocks, bias = buffers["blocks"], buffers["bias"]
            if other is not None:
                other = (other if other.dim() == 2 else other.reshape(y.shape)).contiguous()
            args = (
                x2.data_ptr(),
                blocks.data_ptr(),
                None if bias is None else bias.data_ptr(),
                None if other is None else other.data_ptr(),
                y.data_ptr(),
                m,
                self.out_features,
                self.in_features,
                self._type_id,
                EPILOGUE_OPS[op],
                self.isa,
            )
            parallel = blocks.numel() * m >= PARALLEL_WEIGHT_BYTES
            call_matmul(lib, *self._kernel_names, args, parallel)
        return y if x.dim() == 2 else y.reshape(out_shape)

    def _fallback(self, x: torch.Tensor, op: str, other: torch.Tensor | None) -> torch.Tensor:
        weight = self.dequantize(x.dtype).to(x.device)
        bias = None if self.bias is None else self.bias.to(x.device, x.dtype)
        return apply_form(F.linear(x, weight, bias), op, other)


class QuantizedEmbedding(_QuantizedMatrix):
    """Token embeddings [num_embeddings, embedding_dim] in a ggml quantized format:
    `forward(ids)` dequantizes the rows `ids` to float32. `as_linear()` is the tied
    LM head over the same bytes."""

    def __init__(
        self,
        blocks: torch.Tensor,
        ggml_type: GGMLType,
        num_embeddings: int,
        embedding_dim: int,
        isa: int | None = None,
    ) -> None:
        super().__init__(blocks, ggml_type, num_embeddings, embedding_dim, isa)
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim

    @classmethod
    def from_gguf_bytes(
        cls,
        data: Any,
        ggml_type: GGMLType | int,
        num_embeddings: int,
        embedding_dim: int,
    ) -> QuantizedEmbedding:
        """The table over a GGUF tensor's raw bytes (see `QuantizedLinear.from_gguf_bytes`;
        GGUF lists the shape as [embedding_dim, num_embeddings])."""
        return cls(_as_uint8(data), GGMLType(ggml_type), num_embeddings, embedding_dim)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The table [num_embeddings, embedding_dim] as floats."""
        return self._dequantize_rows(None, self.embedding_dim).to(dtype)

    def as_linear(self, activations: str | None = None) -> QuantizedLinear:
        """`h -> h E^T`, a `QuantizedLinear` sharing this table's bytes (a tied LM head)."""
        return QuantizedLinear(
            self.blocks,
            self.ggml_type,
            self.embedding_dim,
            self.num_embeddings,
            isa=self.isa,
            activations=activations,
        )

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, type={self.ggml_type.name}"

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1).to(torch.int64).contiguous()
        return self._dequantize_rows(flat, self.embedding_dim).reshape(
            *ids.shape, self.embedding_dim
        )
