"""Which C kernel runs a GGUF-quantized product: the ggml types the kernels take, the
instruction-set level (`OMNISTAGE_QUANT_ISA`), the activation path
(`OMNISTAGE_QUANT_ACTIVATIONS`: "float32" or "int8", see `layers/quantized_linear.py`),
the kernel functions of each path and their addresses (what the decode program and the
C pool call), and a generation count of path changes (a decode program built before a
change rebuilds)."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from functools import cache
from typing import Any

from omnistage import kernels
from omnistage.kernels import work_sharing
from omnistage.layers.ggml_types import GGMLType

FLOAT_KERNEL_TYPES = frozenset({GGMLType.F32, GGMLType.F16, GGMLType.BF16})
"""Float matrices of a GGUF file the C kernels run in their own format (as blocks of
`FLOAT_KERNEL_BLOCK` values without a scale), on the float path only."""

FLOAT_KERNEL_BLOCK = 32
"""A float-typed matrix takes the kernels only when its rows are a multiple of this."""

INT8_TYPES = frozenset(
    {
        GGMLType.Q4_0,
        GGMLType.Q4_1,
        GGMLType.Q8_0,
        GGMLType.Q4_K,
        GGMLType.Q6_K,
    }
)
"""The ggml types whose products take the int8 path when it is asked for (others keep the
float path). Measured on
Zen 4 (2026-11-25, one thread, batch 1, SmolLM2's shapes, weights streamed from memory):
Q4_1 1.1-2.1x faster than the float path with the VNNI or the AVX2 kernels; Q8_0 the
same speed from memory (both read ~9 GB/s there), 1.3-2x faster from cache. Q4_0, Q4_K
and Q6_K share the kernels but were not timed; batches of 64 rows were not timed either
(docs/performance.md)."""

KERNEL_TYPES = INT8_TYPES | FLOAT_KERNEL_TYPES
"""The ggml types the C kernels run; other quantized types take the fallback."""

INT8_TOLERANCE = 1e-2
"""How far the int8 path's outputs may be from the float32 product with the dequantized
weight, as a fraction of the largest output (tests; at most 7.3e-3 measured on random
inputs, 1-1.7e-2 on some of SmolLM2's MLP products; llama.cpp computes the same way)."""

ACTIVATIONS_ENV = "OMNISTAGE_QUANT_ACTIVATIONS"
ACTIVATIONS = ("int8", "float32")

ISA_ENV = "OMNISTAGE_QUANT_ISA"
ISA_NAMES = {"scalar": kernels.ISA_SCALAR, "avx2": kernels.ISA_AVX2, "avx512": kernels.ISA_AVX512}


def isa_level(override: int | None) -> int:
    """`override`, else the level `OMNISTAGE_QUANT_ISA` names, else the best one."""
    if override is not None:
        return override
    name = os.environ.get(ISA_ENV)
    if name is None:
        return kernels.ISA_AVX512  # the library caps it at what this CPU runs
    if name not in ISA_NAMES:
        raise ValueError(f"{ISA_ENV}: expected one of {sorted(ISA_NAMES)}, got {name!r}")
    return ISA_NAMES[name]


DEFAULT_ACTIVATIONS = "float32"
"""The path a kept quantized weight takes unless told otherwise. Measured on Zen 4
(2026-11-25, AVX-512 VNNI, SmolLM2-135M Q4_1, two threads) the int8 path is faster at one
row and at 64 (decode layers 4.2 against 5.6 ms a step; products of 64 rows 25-40 %
faster for Q4_1 and Q8_0), but it is not the default: the built-in model's answer to
`make run`'s question starts on a near tie, and int8 activations flip it to "L'Étoile, la
Cité, ..." (llama.cpp answers the same way on that file: "L'Étoile, la Marseillaise, ...")
where the float path answers "The capital of France is Paris." as the float32 model does."""


def activation_path(override: str | None) -> str:
    """`override`, else the path `OMNISTAGE_QUANT_ACTIVATIONS` names, else
    `DEFAULT_ACTIVATIONS` (a layer takes int8 only for `INT8_TYPES`: its `activations`)."""
    name = override if override is not None else os.environ.get(ACTIVATIONS_ENV)
    if name is None:
        name = DEFAULT_ACTIVATIONS
    if name not in ACTIVATIONS:
        source = "activations" if override is not None else ACTIVATIONS_ENV
        raise ValueError(f"{source}: expected one of {list(ACTIVATIONS)}, got {name!r}")
    return name


KERNEL_FUNCTIONS = {
    "int8": ("quant_matmul_q8", "quant_matmul_q8_team"),
    "float32": ("quant_matmul_f32", "quant_matmul_f32_team"),
}
"""Each path's work-sharing kernel and its OpenMP-team twin in `kernels.load_quant()`."""


def kernel_library(ggml_type: GGMLType) -> Any:
    return kernels.load_quant() if ggml_type in KERNEL_TYPES else None


@cache
def kernel_address(lib: Any, name: str) -> int:
    """The address of `lib`'s function `name` (what the C pool calls)."""
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


_path_generation = 0
"""Bumped whenever a layer's `activations` is reassigned (a decode program built before
then runs the old path's kernel: `path_generation()` tells it to rebuild)."""


def path_generation() -> int:
    return _path_generation


def bump_path_generation() -> None:
    global _path_generation
    _path_generation += 1


@dataclass(frozen=True)
class KernelCall:
    """A product as a C work-sharing kernel runs it: the kernel's address (`quant_matmul_f32`
    or `quant_matmul_q8` of `kernels.load_quant()`), the weight's blocks, the float32 bias
    (or None), the ggml type id and the instruction-set level."""

    kernel: int
    weight: int
    bias: int | None
    type_id: int
    isa: int


def call_matmul(lib: Any, kernel: str, team: str, args: tuple, parallel: bool) -> None:
    """Run `lib`'s work-sharing product `kernel` (its OpenMP twin `team`) on `args`: on the
    C pool the decode program runs on where it is built, else on torch's team or helper
    threads (`work_sharing.run`); on one thread unless `parallel`."""
    pool = kernels.load()
    if pool is not None:
        threads = work_sharing.kernel_threads() if parallel else 1
        pool.pool_matmul(kernel_address(lib, kernel), *args, threads)
    else:
        work_sharing.run(getattr(lib, kernel), getattr(lib, team), *args, parallel=parallel)
