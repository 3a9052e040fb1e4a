"""A decode step's decoder layers as one C call: `DecodeProgramBuilder` and `DecodeProgram`.

At batch 1 a small model's decode step is a few hundred kernel calls, each costing
~7 us of Python and ctypes overhead (SmolLM2-135M Q4_1: ~6 ms of a 16 ms step,
docs/performance.md). A model describes its layers once to a `DecodeProgramBuilder`
(`rms_norm`, `linear`, `qk_norm`, `rope_and_write_kv`, `attention`: the ops its Python forward
runs, on the same modules); `build()` gives a `DecodeProgram`, which runs a step of
decodes (one new token per sequence) through `kernels/decode_program.c` in one call.

Each op calls the same C function the module's own forward calls, and no result
depends on the thread that computes it, so a step run as a program is bit-identical
to the module-by-module forward: every equivalence test keeps holding, and the
program is just the faster way through the same arithmetic.

What a program takes: float32 rows; `RMSNorm` with a float32 weight (also per q/k head,
Qwen3's); `QuantizedLinear` with a C kernel and a float32 checkpoint's `PanelLinear`
(`kernel_call()`); attention on the CPU platform's paged KV cache
(neox rotary from a cos/sin table, decode attention within the kernel's limits). A
builder raises `NotProgrammable` for anything else, and the model keeps its forward.

Buffers: every value an op produces is a row buffer of the value's width; buffers
are reused once a value is dead (a value's buffer is never an input of the op that
writes it). They grow with the number of rows, and the output a step returns is a
view of one of them, valid until the program runs again.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Any

import torch

from omnistage import kernels
from omnistage.kernels import work_sharing
from omnistage.layers.norm import RMSNorm
from omnistage.layers.panel_linear import PanelLinear
from omnistage.layers.quant_paths import path_generation
from omnistage.layers.quantized_linear import EPILOGUE_OPS, QuantizedLinear

_OP_RMS_NORM, _OP_MATMUL, _OP_ROPE_KV, _OP_ATTENTION, _OP_QK_NORM = 1, 2, 3, 4, 5

DISABLE_ENV = "OMNISTAGE_DISABLE_DECODE_PROGRAM"
"""Set (to anything): models run every step layer by layer (read when a program is built;
tests compare both ways, and it rules the program out when chasing a bug)."""


class NotProgrammable(Exception):
    """The model (or one of its modules) has no decode program here."""


class ProgramOp(ctypes.Structure):
    """`struct program_op` of `kernels/decode_program.c`, field for field."""

    _fields_ = [
        ("kind", ctypes.c_int64),
        ("src", ctypes.c_int64),
        ("dst", ctypes.c_int64),
        ("other", ctypes.c_int64),
        ("width", ctypes.c_int64),
        ("depth", ctypes.c_int64),
        ("type", ctypes.c_int64),
        ("epilogue", ctypes.c_int64),
        ("isa", ctypes.c_int64),
        ("weight", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("kernel", ctypes.c_void_p),
        ("eps_or_scale", ctypes.c_double),
        ("kv_cache", ctypes.c_void_p),
        ("heads", ctypes.c_int64),
        ("kv_heads", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("num_blocks", ctypes.c_int64),
        ("block_size", ctypes.c_int64),
        ("cos_table", ctypes.c_void_p),
        ("sin_table", ctypes.c_void_p),
        ("k_weight", ctypes.c_void_p),
    ]


@dataclass(frozen=True)
class Value:
    """A row buffer an op of the program reads or writes: its id and floats per row."""

    id: int
    width: int


@dataclass(frozen=True)
class AttentionShape:
    """The geometry an attention op reads its qkv rows and the KV cache with."""

    heads: int
    kv_heads: int
    head_dim: int

    @property
    def qkv_width(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim


class DecodeProgramBuilder:
    """Collects the ops of a decode step in order; `build(output)` gives the program.

    Every method raises `NotProgrammable` where its module has no C path here."""

    def __init__(self, width: int) -> None:
        if os.environ.get(DISABLE_ENV):
            raise NotProgrammable(f"{DISABLE_ENV} is set")
        self._lib = kernels.load()
        if self._lib is None:
            raise NotProgrammable("the C kernels are not built here")
        self._widths: list[int] = [width]
        self._ops: list[tuple[dict[str, Any], tuple[int, ...], int | None]] = []
        """(fields, values read: src then `other`, value written) per op."""
        self._keep: list[torch.Tensor] = []
        """Tensors the ops point into (weights, tables, caches): kept alive with the program."""

    @property
    def input(self) -> Value:
        """The step's input rows (the embeddings), the value every program starts from."""
        return Value(0, self._widths[0])

    def _value(self, width: int) -> Value:
        self._widths.append(width)
        return Value(len(self._widths) - 1, width)

    def _float_tensor(self, tensor: torch.Tensor, what: str) -> int:
        if tensor.dtype != torch.float32 or tensor.device.type != "cpu":
            raise NotProgrammable(f"{what}: {tensor.dtype} on {tensor.device}")
        if not tensor.is_contiguous():
            raise NotProgrammable(f"{what}: not contiguous")
        self._keep.append(tensor)
        return tensor.data_ptr()

    def rms_norm(self, x: Value, norm: Any) -> Value:
        if type(norm) is not RMSNorm or norm.weight.shape[0] != x.width:
            raise NotProgrammable(f"norm: {type(norm).__name__}")
        out = self._value(x.width)
        weight = self._float_tensor(norm.weight, "norm weight")
        fields = dict(kind=_OP_RMS_NORM, width=x.width, weight=weight, eps_or_scale=norm.eps)
        self._ops.append((fields, (x.id,), out.id))
        return out

    def linear(
        self, x: Value, layer: Any, epilogue: str = "none", other: Value | None = None
    ) -> Value:
        """`layer(x)`, `layer.silu(x)`, `layer.mul(x, other)` or `layer.add(x, other)`."""
        if not isinstance(layer, QuantizedLinear | PanelLinear) or layer.in_features != x.width:
            raise NotProgrammable(f"linear: {type(layer).__name__}")
        call = layer.kernel_call()
        if call is None:
            raise NotProgrammable(f"linear: no kernel for {layer.extra_repr()}")
        if other is not None and other.width != layer.out_features:
            raise NotProgrammable("linear: `other` is not of the output's width")
        self._keep.append(layer.blocks if isinstance(layer, QuantizedLinear) else layer.panels)
        if layer.bias is not None:
            self._keep.append(layer.bias)
        out = self._value(layer.out_features)
        fields = dict(
            kind=_OP_MATMUL,
            width=layer.out_features,
            depth=layer.in_features,
            type=call.type_id,
            epilogue=EPILOGUE_OPS[epilogue],
            isa=call.isa,
            weight=call.weight,
            bias=call.bias,
            kernel=call.kernel,
        )
        reads = (x.id,) if other is None else (x.id, other.id)
        self._ops.append((fields, reads, out.id))
        return out

    def qk_norm(self, qkv: Value, shape: AttentionShape, q_norm: Any, k_norm: Any) -> None:
        """RMSNorm of each q head (by `q_norm`) and k head (by `k_norm`) inside `qkv`, in
        place (`norm.qk_norm_in_place`'s per-row function)."""
        norms = (q_norm, k_norm)
        if any(type(n) is not RMSNorm or n.weight.shape != (shape.head_dim,) for n in norms):
            raise NotProgrammable(f"q/k norm: {type(q_norm).__name__}, {type(k_norm).__name__}")
        if q_norm.eps != k_norm.eps or qkv.width != shape.qkv_width:
            raise NotProgrammable("q/k norm: different eps for q and k, or not over qkv rows")
        fields = dict(
            kind=_OP_QK_NORM,
            width=qkv.width,
            heads=shape.heads,
            kv_heads=shape.kv_heads,
            head_dim=shape.head_dim,
            weight=self._float_tensor(q_norm.weight, "q norm weight"),
            k_weight=self._float_tensor(k_norm.weight, "k norm weight"),
            eps_or_scale=q_norm.eps,
        )
        self._ops.append((fields, (qkv.id,), None))

    def _cache_fields(self, shape: AttentionShape, kv_cache: torch.Tensor | None) -> dict[str, Any]:
        if kv_cache is None:
            raise NotProgrammable("attention: no KV cache bound")
        _, kv_heads, num_blocks, block_size, head_dim = kv_cache.shape
        if (kv_heads, head_dim) != (shape.kv_heads, shape.head_dim):
            raise NotProgrammable("attention: the KV cache's shape differs from the layer's")
        return dict(
            kv_cache=self._float_tensor(kv_cache, "KV cache"),
            heads=shape.heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            num_blocks=num_blocks,
            block_size=block_size,
        )

    def rope_and_write_kv(
        self,
        qkv: Value,
        shape: AttentionShape,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: torch.Tensor | None,
    ) -> None:
        """Neox rotary of q and k inside `qkv` (in place; positions from the step) and the
        write of k, v to each sequence's slot."""
        if qkv.width != shape.qkv_width or cos.shape[-1] != shape.head_dim or cos.dim() != 2:
            raise NotProgrammable("rotary: not a plain cos/sin table over the qkv rows")
        fields = self._cache_fields(shape, kv_cache)
        fields.update(
            kind=_OP_ROPE_KV,
            cos_table=self._float_tensor(cos, "cos table"),
            sin_table=self._float_tensor(sin, "sin table"),
        )
        self._ops.append((fields, (qkv.id,), None))

    def attention(
        self, qkv: Value, shape: AttentionShape, kv_cache: torch.Tensor | None, scale: float
    ) -> Value:
        """Decode attention of each row's q heads (inside `qkv`) over its sequence's cache."""
        fields = self._cache_fields(shape, kv_cache)
        if not self._lib.paged_decode_limits_ok(
            shape.heads // shape.kv_heads, fields["block_size"], shape.head_dim
        ):
            raise NotProgrammable("attention: beyond the decode kernel's limits")
        out = self._value(shape.heads * shape.head_dim)
        fields.update(kind=_OP_ATTENTION, eps_or_scale=scale)
        self._ops.append((fields, (qkv.id,), out.id))
        return out

    def build(self, output: Value) -> DecodeProgram:
        """The program whose `run` returns `output`'s rows."""
        output_buffer, buffer_widths, ops = _assign_buffers(self._ops, self._widths, output.id)
        structs = (ProgramOp * len(ops))()
        for struct, fields in zip(structs, ops, strict=True):
            for name, value in fields.items():
                setattr(struct, name, value)
        return DecodeProgram(self._lib, structs, buffer_widths, output_buffer, self._keep)


def _assign_buffers(
    ops: list[tuple[dict[str, Any], tuple[int, ...], int | None]],
    widths: list[int],
    output: int,
) -> tuple[int, list[int], list[dict[str, Any]]]:
    """Physical buffers for the values: the output's buffer id, every buffer's width
    (buffer 0 is the step's input) and each op's fields with its buffer ids. A value's
    buffer is freed after its last read, and only after the op has its own output
    buffer, so no op writes a buffer it reads."""
    last_read: dict[int, int] = {}
    for i, (_, reads, _) in enumerate(ops):
        for v in reads:
            last_read[v] = i
    buffer_of: dict[int, int] = {0: 0}
    buffer_widths = [widths[0]]
    free: dict[int, list[int]] = {}
    out_ops = []
    for i, (fields, reads, writes) in enumerate(ops):
        fields = dict(fields)
        if writes is not None:
            pool = free.get(widths[writes])
            if pool:
                buffer_of[writes] = pool.pop()
            else:
                buffer_of[writes] = len(buffer_widths)
                buffer_widths.append(widths[writes])
            fields["dst"] = buffer_of[writes]
        fields["src"] = buffer_of[reads[0]]
        fields["other"] = buffer_of[reads[1]] if len(reads) > 1 else -1
        for v in set(reads):
            if last_read[v] == i and v not in (0, output):
                free.setdefault(widths[v], []).append(buffer_of[v])
        out_ops.append(fields)
    if output not in buffer_of:
        raise NotProgrammable("the output value is written by no op")
    return buffer_of[output], buffer_widths, out_ops


class DecodeProgram:
    """A decode step's ops, run in one C call per step (`run`)."""

    def __init__(
        self,
        lib: Any,
        ops: ctypes.Array,
        buffer_widths: list[int],
        output_buffer: int,
        keep: list[torch.Tensor],
    ) -> None:
        self._lib = lib
        self._ops = ops
        self._keep = keep
        self._generation = path_generation()
        self._buffer_widths = buffer_widths
        self._output_buffer = output_buffer
        self._rows = 0
        self.steps_run = 0
        """Steps this program ran (tests check that decode steps took it)."""
        self._buffers: list[torch.Tensor] = []
        self._pointers = (ctypes.c_void_p * len(buffer_widths))()

    @property
    def current(self) -> bool:
        """False once a product's kernel path was changed after the program was built."""
        return self._generation == path_generation()

    def _grow(self, rows: int) -> None:
        self._rows = max(rows, 2 * self._rows)
        self._buffers = [torch.empty(0)] + [
            torch.empty(self._rows, width) for width in self._buffer_widths[1:]
        ]
        for i, buffer in enumerate(self._buffers[1:], start=1):
            self._pointers[i] = buffer.data_ptr()

    def run(self, x: torch.Tensor, positions: torch.Tensor, meta: Any) -> torch.Tensor:
        """The output rows of a step of decodes: `x` [rows, width] float32 contiguous;
        `positions` [rows] int64; `meta` the step's `AttentionMetadata` (all decodes, in
        the rows' order)."""
        rows = x.shape[0]
        if rows > self._rows:
            self._grow(rows)
        self._pointers[0] = x.data_ptr()
        self.steps_run += 1
        table = meta.decode_block_table
        self._lib.decode_program_run(
            self._ops,
            len(self._ops),
            self._pointers,
            rows,
            positions.data_ptr(),
            meta.slot_mapping.data_ptr(),
            table.data_ptr(),
            meta.decode_seq_lens.data_ptr(),
            table.shape[1],
            work_sharing.kernel_threads(),
        )
        return self._buffers[self._output_buffer][:rows]
