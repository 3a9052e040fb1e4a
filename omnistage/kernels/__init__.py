"""Small C kernels for the CPU hot path, built on first use and cached.

No torch headers: each kernel is plain C over raw pointers, compiled with the
system C compiler in about a second into
`$OMNISTAGE_CACHE_DIR/kernels/<hash of source, flags, compiler and CPU>/`, and
called through ctypes. Where no compiler is found or the build fails, the
loaders return None (logged once) and callers use their pure-torch path.

Two libraries:
- `load()`: attention, rotary and RMSNorm (also per q/k head) kernels (float32 and
  bfloat16, `kernel_suffix`), the decode program that runs a
  step's layers in one call (`decode_program.c`) and a small dense decoder's step over
  short per-row sequences (`dense_step.c`, the code predictor's), the sampler's
  exponential-race draws, top-k filter and top-p cutoff (`sample_race.c`), `cc -O3 -march=native -fopenmp` and
  -ffast-math's parts (the kernels use no infinities), but not -ffast-math itself,
  whose start-up code would flush subnormals for the whole process;
- `load_quant()`: matrix products on GGUF-quantized weights (`quant_*.c`, one
  file per concept, `quant_blocks.h` says which), built for the baseline of the architecture, without
  -march=native: it picks AVX-512, AVX2 or portable loops at run time from its
  `isa` argument, so every path can be run (and tested) on one machine. Not
  -ffast-math either (which would flush subnormals for the whole process):
  only reassociation, for vectorized sums.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch

from omnistage.cache import cache_root

logger = logging.getLogger("omnistage")

_SOURCES = [
    Path(__file__).with_name(n)
    for n in (
        "paged_attention.c",
        "rope_cache.c",
        "rms_norm.c",
        "decode_program.c",
        "dense_step.c",
        "sample_race.c",
    )
]
_QUANT_SOURCES = [
    Path(__file__).with_name(n)
    for n in (
        "quant_dequant.c",
        "quant_epilogue.c",
        "quant_matmul.c",
        "quant_act8.c",
        "quant_dot8.c",
        "quant_matmul_q8.c",
    )
]
_HEADERS = sorted(Path(__file__).parent.glob("*.h"))
"""Headers the sources include: part of the cache key, not of the command line."""
_DISABLE_ENV = "OMNISTAGE_DISABLE_C_KERNELS"
PROFILE_ENV = "OMNISTAGE_PROFILE_DECODE_PROGRAM"
"""Set: `load()` builds the decode program with its per-op clock (`-DPROGRAM_PROFILE`;
`decode_program_profile()` returns the totals; benchmarks/decode_profile.py reads them)."""
_FAST_MATH = (
    "-fno-math-errno",
    "-fno-trapping-math",
    "-ffinite-math-only",
    "-fno-signed-zeros",
    "-fassociative-math",
    "-freciprocal-math",
)
"""What -ffast-math turns on, spelled out: given whole, GCC 12 links crtfastmath.o into the
library, which sets flush-to-zero / denormals-are-zero for the whole process on load."""
_NATIVE_FLAGS = ("-O3", "-march=native", "-fopenmp", "-pthread", *_FAST_MATH)
_PORTABLE_FLAGS = (
    "-O3",
    "-fopenmp",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-fno-signed-zeros",
    "-fassociative-math",
    "-ffp-contract=fast",
)


def _cpu_fingerprint() -> str:
    try:
        flags = next(
            (
                line
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("flags")
            ),
            "",
        )
    except OSError:
        flags = ""
    return platform.machine() + flags


@cache
def load() -> ctypes.CDLL | None:
    """The compiled kernel library, or None when it cannot be built here."""
    if os.environ.get(_DISABLE_ENV):
        return None
    lib = load_variant(("-DPROGRAM_PROFILE",) if os.environ.get(PROFILE_ENV) else ())
    if lib is not None and os.environ.get(PROFILE_ENV):
        lib.decode_program_profile.restype = ctypes.POINTER(ctypes.c_int64)
        lib.decode_program_profile.argtypes = []
    return lib


def load_variant(extra_flags: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """The library built with `extra_flags` added (tests build the generic paths of this
    CPU with e.g. `-mno-avx512f`), or None when it cannot be built here."""
    lib = _compiled("libomnistage_kernels.so", _SOURCES, (*_NATIVE_FLAGS, *extra_flags))
    if lib is None:
        return None
    decode_args = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 7 + [ctypes.c_float]
    for dtype in ("f32", "bf16"):  # the float32 and the bfloat16 variant of each
        for fn, last in (
            (getattr(lib, f"paged_decode_attention_{dtype}"), ctypes.c_void_p),  # work counter
            (getattr(lib, f"paged_decode_attention_{dtype}_team"), ctypes.c_int),  # threads
        ):
            fn.restype = None
            fn.argtypes = [*decode_args, last]
        rope = getattr(lib, f"rope_write_kv_{dtype}")
        rope.restype = None
        rope.argtypes = (
            [ctypes.c_void_p]
            + [ctypes.c_int64] * 4
            + [ctypes.c_void_p] * 4
            + [ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]
        )
        norm = getattr(lib, f"rms_norm_{dtype}")
        norm.restype = None
        norm.argtypes = (
            [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2 + [ctypes.c_float, ctypes.c_int]
        )
        qk_norm = getattr(lib, f"qk_norm_{dtype}")
        qk_norm.restype = None
        # qkv, rows, row stride, heads, kv_heads, head_dim, q weight, k weight, eps, threads
        qk_norm.argtypes = (
            [ctypes.c_void_p]
            + [ctypes.c_int64] * 5
            + [ctypes.c_void_p] * 2
            + [ctypes.c_float, ctypes.c_int]
        )
    program = lib.decode_program_run
    program.restype = None
    # ops, n_ops, buffers, rows, positions, slots, block_table, seq_lens, max_blocks, threads
    program.argtypes = (
        [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
        + [ctypes.c_void_p] * 4
        + [ctypes.c_int64, ctypes.c_int]
    )
    pool_matmul = lib.pool_matmul
    pool_matmul.restype = None
    # kernel, x, w, bias, other, y, M, N, K, type, op, isa, threads
    pool_matmul.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 3 + [ctypes.c_int] * 4
    dense = lib.dense_step_f32
    dense.restype = ctypes.c_int
    # layers, shape, input, ids, table, table rows, rows, t, start, cache, cos, sin, final
    # norm, projection (w, b), head, logits, threads
    dense.argtypes = (
        [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 4 + [ctypes.c_void_p] * 8 + [ctypes.c_int]
    )
    race = lib.race_exponentials_f32
    race.restype = None
    race.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]
    top_k = lib.top_k_mask_f32
    top_k.restype = ctypes.c_int
    # logits, rows, vocab, k, scratch, heap size, threads
    top_k.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_void_p,
        ctypes.c_void_p,
    ] + [ctypes.c_int64, ctypes.c_int]
    top_p = lib.top_p_cutoff_f32
    top_p.restype = None
    # probs, rows, vocab, p, prefix, cutoff, resolved, scratch, threads
    top_p.argtypes = (
        [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
        + [ctypes.c_void_p] * 3
        + [ctypes.c_int]
    )
    lib.paged_decode_limits_ok.restype = ctypes.c_int
    lib.paged_decode_limits_ok.argtypes = [ctypes.c_int64] * 3
    return lib


@cache
def load_quant() -> ctypes.CDLL | None:
    """The quantized-matmul library (`quant_matmul.c`), or None when it cannot be built here.

    Its functions take the ggml type id of the weights and an instruction-set
    level (`ISA_*`; capped at what this CPU runs, `quant_best_isa()`).
    """
    if os.environ.get(_DISABLE_ENV):
        return None
    lib = _compiled("libomnistage_quant.so", _QUANT_SOURCES, _PORTABLE_FLAGS)
    if lib is None:
        return None
    i64, i32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
    matmul_args = [ptr] * 5 + [i64] * 3 + [i32] * 3  # x, w, bias, other, y, M, N, K, type, op, isa
    signatures = {
        "quant_matmul_f32": (None, [*matmul_args, ptr]),  # + the shared work counter
        "quant_matmul_f32_team": (None, [*matmul_args, i32]),  # + the team's threads
        "quant_matmul_q8": (None, [*matmul_args, ptr]),  # the int8 path, as the f32 one
        "quant_matmul_q8_team": (None, [*matmul_args, i32]),
        "quant_q8_isa": (i32, [i32]),  # the level the int8 path runs for an `isa`
        # w, N, K, type, rows (or NULL), n_rows, out, isa
        "quant_dequantize_rows_f32": (i32, [ptr, i64, i64, i32, ptr, i64, ptr, i32]),
        "quant_block_elems": (i32, [i32]),
        "quant_block_bytes": (i32, [i32]),
        "quant_best_isa": (i32, []),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


KERNEL_SUFFIXES = {torch.float32: "f32", torch.bfloat16: "bf16"}


def kernel_suffix(*tensors: torch.Tensor) -> str | None:
    """ "f32" or "bf16" where every tensor is a CPU tensor of that one dtype (the kernels of
    `load()` named `..._f32` / `..._bf16` take them), else None."""
    dtype = tensors[0].dtype
    for t in tensors:  # a plain loop: this runs several times a layer and step
        if t.dtype is not dtype or not t.is_cpu:
            return None
    return KERNEL_SUFFIXES.get(dtype)


ISA_SCALAR, ISA_AVX2, ISA_AVX512 = 0, 1, 2
"""Instruction-set levels of `load_quant()`'s kernels: portable C, AVX2 + FMA, AVX-512."""


def _compiled(name: str, sources: list[Path], flags: tuple[str, ...]) -> ctypes.CDLL | None:
    """`sources` built with `flags` into a shared library (cached), or None."""
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        logger.info("no C compiler found: using the pure-torch path instead of %s", name)
        return None
    source = b"".join(p.read_bytes() for p in [*sources, *_HEADERS]) + " ".join(flags).encode()
    key = hashlib.sha256(source + compiler.encode() + _cpu_fingerprint().encode()).hexdigest()[:16]
    target = cache_root() / "kernels" / key / name
    if not target.exists():
        try:
            _build(compiler, target, sources, flags)
        except (OSError, subprocess.CalledProcessError) as exc:
            logger.warning("building %s failed (%s): using the torch path", name, exc)
            return None
    return ctypes.CDLL(str(target))


def _build(compiler: str, target: Path, sources: list[Path], flags: tuple[str, ...]) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        cmd = [compiler, *flags, "-shared", "-fPIC", *map(str, sources), "-o", str(out), "-lm"]
        subprocess.run(cmd, check=True, capture_output=True)
        os.replace(out, target)  # atomic: concurrent builders never see half a library
    logger.info("built C kernels: %s", target)
