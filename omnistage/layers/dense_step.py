"""A small dense decoder's step over short per-row sequences as one C call: `DenseStep`.

A multi-codebook talker's code predictor runs its decoder (Qwen3-style: q/k RMSNorm, neox
rotary, fused q/k/v and gate/up products) 15 times per frame over a fresh sequence of
at most 17 positions per request. From torch each step is ~40 small ops per layer, and on
a small model their call overhead is the cost. `DenseStep` runs a whole step (the input
rows' projection where the model has one, every layer, then the final norm of each row's
last position and a head product) through `kernels/dense_step.c` in one call, for a batch
of rows, each row with its own cache.

It takes float32 tensors on the CPU only, and its sums are not torch's (the same values
to float32 rounding, not bit-identical): a float64 model keeps its torch path, which the
exact equivalence tests run. A row's result does not depend on the other rows or the
thread count. `build` returns None where the C path does not apply (the kernels are not
built, the weights are not float32 on the CPU, or `DISABLE_ENV` is set).
"""

from __future__ import annotations

import ctypes
import math
import os
from dataclasses import dataclass, fields

import torch

from omnistage import kernels
from omnistage.layers.decode_program import DISABLE_ENV

__all__ = [
    "DISABLE_ENV",
    "DenseLayerWeights",
    "DenseStep",
    "DenseWeights",
    "FrameDraws",
    "embedding_sum",
]


@dataclass(frozen=True)
class DenseLayerWeights:
    """One layer's tensors, as torch's modules hold them (products [out, in])."""

    input_norm: torch.Tensor
    qkv_w: torch.Tensor
    """[(heads + 2 * kv_heads) * head_dim, hidden]: q rows, then k, then v."""
    qkv_b: torch.Tensor | None
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    o_w: torch.Tensor
    o_b: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up_w: torch.Tensor
    """[2 * intermediate, hidden]: gate rows, then up."""
    down_w: torch.Tensor


@dataclass(frozen=True)
class DenseWeights:
    """The whole decoder: its layers and the tensors around them."""

    layers: list[DenseLayerWeights]
    final_norm: torch.Tensor
    cos: torch.Tensor
    """[max_len, head_dim] (as `RotaryEmbedding` holds it); `sin` alike."""
    sin: torch.Tensor
    projection: tuple[torch.Tensor, torch.Tensor | None] | None
    """(weight [hidden, in_width], bias) applied to the input rows first, or None."""

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor a step reads, in a fixed order."""
        around = [self.final_norm, self.cos, self.sin, *(self.projection or ())]
        inside = [t for layer in self.layers for t in vars(layer).values()]
        return [t for t in around + inside if t is not None]


@dataclass(frozen=True)
class FrameDraws:
    """How each row's codes of a frame are drawn (`DenseStep.frame`): a row at temperature 0
    greedily, else by the sampler's exponential race at its temperature with its top-k (0:
    none), keyed by the sampler's `row_seed(seeds[r], positions[r] * codes + j)` for code
    j. Built with `of`."""

    temperature: torch.Tensor
    """[rows] float32."""
    top_k: torch.Tensor
    """[rows] int64."""
    seeds: torch.Tensor
    """[rows] int64 (the seeds' 64 bits)."""
    positions: torch.Tensor
    """[rows] int64: the frame's output position."""

    @classmethod
    def of(
        cls, temperature: list[float], top_k: list[int], seeds: list[int], positions: list[int]
    ) -> FrameDraws:
        return cls(
            torch.tensor(temperature, dtype=torch.float32),
            torch.tensor(top_k, dtype=torch.int64),
            torch.tensor([s - (1 << 64) if s >= 1 << 63 else s for s in seeds], dtype=torch.int64),
            torch.tensor(positions, dtype=torch.int64),
        )

    @property
    def rows(self) -> int:
        return self.temperature.shape[0]

    def pointers(self) -> tuple[int, int, int, int]:
        return tuple(t.data_ptr() for t in vars(self).values())  # type: ignore[return-value]


class _Layer(ctypes.Structure):
    """`struct dense_layer` of `kernels/dense_step.c`, field for field."""

    _fields_ = [(f.name, ctypes.c_void_p) for f in fields(DenseLayerWeights)]


_SIZES = ("hidden", "heads", "kv_heads", "head_dim", "intermediate", "layers", "max_len")


class _Shape(ctypes.Structure):
    """`struct dense_shape` of `kernels/dense_step.c`."""

    _fields_ = [(name, ctypes.c_int64) for name in (*_SIZES, "vocab", "in_width")] + [
        ("eps", ctypes.c_double),
        ("scale", ctypes.c_double),
    ]


def _usable(tensor: torch.Tensor) -> bool:
    return tensor.dtype == torch.float32 and tensor.device.type == "cpu" and tensor.is_contiguous()


def _pointer(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


class DenseStep:
    """A decoder's steps in one C call each; `new_cache(rows)`, then `run` per step."""

    def __init__(
        self,
        lib: ctypes.CDLL,
        weights: DenseWeights,
        geometry: tuple[int, int, int],
        eps: float,
        vocab: int,
    ) -> None:
        heads, kv_heads, head_dim = geometry
        self._lib = lib
        self._weights = weights
        """The tensors the structs point into, kept alive."""
        self._pointers = [t.data_ptr() for t in weights.tensors()]
        self._layers = (_Layer * len(weights.layers))()
        for struct, layer in zip(self._layers, weights.layers, strict=True):
            for name, tensor in vars(layer).items():
                setattr(struct, name, _pointer(tensor))
        hidden = weights.final_norm.shape[0]
        projection = weights.projection
        self._shape = _Shape(
            hidden,
            heads,
            kv_heads,
            head_dim,
            weights.layers[0].gate_up_w.shape[0] // 2,
            len(weights.layers),
            weights.cos.shape[0],
            vocab,
            hidden if projection is None else projection[0].shape[1],
            eps,
            1.0 / math.sqrt(head_dim),
        )
        self._projection = (None, None) if projection is None else projection

    @staticmethod
    def disabled() -> bool:
        """Whether `DISABLE_ENV` rules the C path out (read at every call: tests toggle it)."""
        return bool(os.environ.get(DISABLE_ENV))

    @staticmethod
    def kernels_built() -> bool:
        """Whether the C kernels are built here (else `build` gives None)."""
        return kernels.load() is not None

    @classmethod
    def build(
        cls, weights: DenseWeights, geometry: tuple[int, int, int], eps: float, vocab: int
    ) -> DenseStep | None:
        """The step over `weights` ((heads, kv_heads, head_dim) `geometry`), or None where
        the C path does not apply."""
        if cls.disabled() or not all(_usable(t) for t in weights.tensors()):
            return None
        lib = kernels.load()
        if lib is None:
            return None
        return cls(lib, weights, geometry, eps, vocab)

    def points_into(self, weights: DenseWeights) -> bool:
        """Whether this step reads these very tensors (False once one was replaced: a move,
        a reload into new memory)."""
        return [t.data_ptr() for t in weights.tensors()] == self._pointers

    def new_cache(self, rows: int) -> torch.Tensor:
        """A cache for `rows` fresh sequences: [rows, layers, 2, kv_heads, max_len, head_dim]."""
        s = self._shape
        return torch.empty(rows, s.layers, 2, s.kv_heads, s.max_len, s.head_dim)

    def run(
        self, x: torch.Tensor, start: int, cache: torch.Tensor, head: torch.Tensor
    ) -> torch.Tensor:
        """Positions start..start+t-1 of each row (`x` [rows, t, in_width]) -> logits
        [rows, vocab] of each row's last position through `head` [vocab, hidden]; their k
        and v are written to `cache`."""
        rows, t, width = x.shape
        if width != self._shape.in_width:
            raise ValueError(f"dense step: x {tuple(x.shape)} at {start} does not fit")
        if not _usable(x):
            raise ValueError("dense step: x, head and cache must be contiguous float32 CPU rows")
        return self._step(rows, t, start, cache, head, x.data_ptr(), None, None, 0)

    def run_codes(
        self,
        codes: torch.Tensor,
        table: torch.Tensor,
        start: int,
        cache: torch.Tensor,
        head: torch.Tensor,
    ) -> torch.Tensor:
        """`run` of one position per row whose input is the row of `table` [V, in_width] at
        the row's code (`codes` [rows] int64): the embedding lookup in the same call, the
        same values as `run(table[codes][:, None], ...)`. An IndexError for a code outside
        the table."""
        if codes.dtype != torch.int64 or codes.ndim != 1 or not codes.is_contiguous():
            raise ValueError("dense step: codes must be a contiguous int64 [rows] tensor")
        if table.ndim != 2 or table.shape[1] != self._shape.in_width or not _usable(table):
            raise ValueError(f"dense step: table {tuple(table.shape)} is not [V, in_width] float32")
        rows = codes.shape[0]
        return self._step(
            rows, 1, start, cache, head, None, codes.data_ptr(), table.data_ptr(), table.shape[0]
        )

    def frame(
        self,
        x: torch.Tensor,
        cache: torch.Tensor,
        tables: list[torch.Tensor],
        heads: list[torch.Tensor],
        draws: FrameDraws | None = None,
    ) -> torch.Tensor:
        """Every code of a frame in one call: `run(x, 0, cache, heads[0])`, then code j
        (j >= 1) from `run_codes` of code j-1 in `tables[j-1]` read by `heads[j]`, each
        code drawn from its logits as `draws` says (None: every row greedy) -> codes
        [rows, len(heads)] int64. A greedy row's code is its logits' argmax (the first
        maximal entry, NaN counting as maximal, as `Sampler` takes it), so its codes equal
        those of the calls one at a time with an argmax between them."""
        rows, t, width = x.shape
        s = self._shape
        if width != s.in_width or not _usable(x) or cache.shape[0] != rows:
            raise ValueError(f"dense step: x {tuple(x.shape)} does not fit a frame")
        if t + len(heads) - 1 > s.max_len or len(tables) != len(heads) - 1:
            raise ValueError(f"dense step: {len(heads)} codes after {t} positions do not fit")
        if any(tuple(h.shape) != (s.vocab, s.hidden) or not _usable(h) for h in heads) or any(
            t.ndim != 2 or t.shape[1] != s.in_width or not _usable(t) for t in tables
        ):
            raise ValueError("dense step: heads or tables of the wrong shape")
        table_rows = tables[0].shape[0] if tables else 0
        if any(t.shape[0] != table_rows for t in tables):
            raise ValueError("dense step: the code tables differ in rows")
        if draws is not None and draws.rows != rows:
            raise ValueError(f"dense step: draws for {draws.rows} rows, x has {rows}")
        codes = torch.empty(rows, len(heads), dtype=torch.int64)
        failed = self._lib.dense_frame_f32(
            ctypes.addressof(self._layers),
            ctypes.addressof(self._shape),
            x.data_ptr(),
            t,
            rows,
            cache.data_ptr(),
            *self._around(),
            (ctypes.c_void_p * max(len(tables), 1))(*(tb.data_ptr() for tb in tables)),
            table_rows,
            (ctypes.c_void_p * len(heads))(*(h.data_ptr() for h in heads)),
            len(heads),
            *(draws.pointers() if draws is not None else (None,) * 4),
            codes.data_ptr(),
            torch.get_num_threads(),
        )
        _raise_on(failed, table_rows)
        return codes

    def _around(self) -> tuple[int | None, ...]:
        """The rotary tables, final norm and input projection, as a call passes them."""
        w = self._weights
        return (
            w.cos.data_ptr(),
            w.sin.data_ptr(),
            w.final_norm.data_ptr(),
            *map(_pointer, self._projection),
        )

    def _step(
        self,
        rows: int,
        t: int,
        start: int,
        cache: torch.Tensor,
        head: torch.Tensor,
        x: int | None,
        ids: int | None,
        table: int | None,
        table_rows: int,
    ) -> torch.Tensor:
        s = self._shape
        if start + t > s.max_len or tuple(head.shape) != (s.vocab, s.hidden):
            raise ValueError(f"dense step: a step of {t} positions at {start} does not fit")
        if not (_usable(head) and cache.shape[0] == rows):
            raise ValueError("dense step: head and cache must be contiguous float32 CPU rows")
        logits = torch.empty(rows, s.vocab)
        failed = self._lib.dense_step_f32(
            ctypes.addressof(self._layers),
            ctypes.addressof(self._shape),
            x,
            ids,
            table,
            table_rows,
            rows,
            t,
            start,
            cache.data_ptr(),
            *self._around(),
            head.data_ptr(),
            logits.data_ptr(),
            torch.get_num_threads(),
        )
        _raise_on(failed, table_rows)
        return logits


def _raise_on(failed: int, table_rows: int) -> None:
    """The error a C step's nonzero return means."""
    if failed == -2:
        raise IndexError(f"dense step: a code outside the table's {table_rows} rows")
    if failed:
        raise MemoryError("dense step: no scratch memory")


def embedding_sum(tables: list[torch.Tensor], codes: torch.Tensor) -> torch.Tensor | None:
    """[n, m] int64 codes -> [n, width]: row r is tables[0][codes[r, 0]] + tables[1][codes[r,
    1]] + ..., added in that order (the same floats as the lookups and adds in torch), in
    one C call; None where it does not apply (tables not contiguous float32 CPU ones of one
    width, no C kernels, or `DISABLE_ENV` set). An IndexError names a code outside its
    table."""
    n, m = codes.shape
    if len(tables) < m or DenseStep.disabled() or not all(_usable(t) for t in tables[:m]):
        return None
    width, table_rows = tables[0].shape[1], tables[0].shape[0]
    if any(t.ndim != 2 or t.shape != (table_rows, width) for t in tables[:m]):
        return None
    lib = kernels.load()
    if lib is None or codes.device.type != "cpu":
        return None
    codes = codes.contiguous()
    out = torch.empty(n, width)
    pointers = (ctypes.c_void_p * m)(*(t.data_ptr() for t in tables[:m]))
    failed = lib.embedding_sum_f32(
        pointers, table_rows, width, codes.data_ptr(), n, m, out.data_ptr()
    )
    if failed:
        raise IndexError(f"a code outside the embedding tables' {table_rows} rows")
    return out
