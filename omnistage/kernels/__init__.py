"""Small C kernels for the CPU hot path, built on first use and cached.

No torch headers: each kernel is plain C over raw pointers, compiled with the
system C compiler (a file per job, ~8 s on 2 cores the first time) into
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

import contextlib
import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
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
        "panel_matmul.c",
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


_P, _I64, _I32, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
_DECODE_ARGS = [_P] * 5 + [_I64] * 7 + [_F32]
"""q, kv, block table, seq lens, out; batch, heads, kv heads, head dim, blocks, block size,
max blocks; scale."""


def _per_dtype(dtype: str) -> dict[str, tuple[type | None, list]]:
    """The signatures of `load()`'s kernels that come as a float32 ("f32") and a bfloat16
    ("bf16") variant."""
    return {
        f"paged_decode_attention_{dtype}": (None, [*_DECODE_ARGS, _P]),  # + work counter
        f"paged_decode_attention_{dtype}_team": (None, [*_DECODE_ARGS, _I32]),  # + threads
        # qkv, tokens, heads, kv heads, head dim, positions, cos, sin, cache, slots, slot, threads
        f"rope_write_kv_{dtype}": (None, [_P] + [_I64] * 4 + [_P] * 4 + [_I64, _P, _I32]),
        f"rms_norm_{dtype}": (None, [_P] * 3 + [_I64] * 2 + [_F32, _I32]),
        # qkv, rows, row stride, heads, kv_heads, head_dim, q weight, k weight, eps, threads
        f"qk_norm_{dtype}": (None, [_P] + [_I64] * 5 + [_P] * 2 + [_F32, _I32]),
    }


_KERNEL_SIGNATURES: dict[str, tuple[type | None, list]] = {
    **_per_dtype("f32"),
    **_per_dtype("bf16"),
    # ops, n_ops, buffers, rows, positions, slots, block_table, seq_lens, max_blocks, threads
    "decode_program_run": (None, [_P, _I64, _P, _I64] + [_P] * 4 + [_I64, _I32]),
    # kernel, x, w, bias, other, y, M, N, K, type, op, isa, threads
    "pool_matmul": (None, [_P] * 6 + [_I64] * 3 + [_I32] * 4),
    # layers, shape, input, ids, table, table rows, rows, t, start, cache, cos, sin, final
    # norm, projection (w, b), head, logits, threads
    "dense_step_f32": (_I32, [_P] * 5 + [_I64] * 4 + [_P] * 8 + [_I32]),
    # layers, shape, in, t, rows, cache, cos, sin, final norm, projection w / b, tables,
    # table rows, heads, codes per frame, temperature, top-k, seeds, positions, codes, threads
    "dense_frame_f32": (
        _I32,
        [_P, _P, _P, _I64, _I64] + [_P] * 7 + [_I64, _P, _I64] + [_P] * 5 + [_I32],
    ),
    # tables, table rows, width, codes, n, m, out
    "embedding_sum_f32": (_I32, [_P, _I64, _I64, _P, _I64, _I64, _P]),
    # keys, rows, vocab, q, threads
    "race_exponentials_f32": (None, [_P, _I64, _I64, _P, _I32]),
    # probs, rows, vocab, keys, picks, threads
    "race_pick_f32": (None, [_P, _I64, _I64, _P, _P, _I32]),
    # logits, rows, vocab, k, scratch, heap size, threads
    "top_k_mask_f32": (_I32, [_P, _I64, _I64, _P, _P, _I64, _I32]),
    # probs, rows, vocab, p, prefix, cutoff, resolved, scratch, threads
    "top_p_cutoff_f32": (None, [_P, _I64, _I64, _P, _I64] + [_P] * 3 + [_I32]),
    "paged_decode_limits_ok": (_I32, [_I64] * 3),
}
"""Return and argument types of every function `load()` calls."""


def _declare(lib: ctypes.CDLL, signatures: dict[str, tuple[type | None, list]]) -> None:
    """Set each named function's `restype` and `argtypes`."""
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


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
    _declare(lib, _KERNEL_SIGNATURES)
    return lib


@cache
def load_quant() -> ctypes.CDLL | None:
    """The quantized-matmul library (`quant_matmul.c`, and the float32 column panels of
    `panel_matmul.c`), or None when it cannot be built here.

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
        "panel_matmul_f32": (None, [*matmul_args, ptr]),  # float32 panels, the same call
        "panel_matmul_f32_team": (None, [*matmul_args, i32]),
        "panel_pack_f32": (None, [ptr, i64, i64, ptr]),  # w [N, K] -> panels
        "quant_q8_isa": (i32, [i32]),  # the level the int8 path runs for an `isa`
        # w, N, K, type, rows (or NULL), n_rows, out, isa
        "quant_dequantize_rows_f32": (i32, [ptr, i64, i64, i32, ptr, i64, ptr, i32]),
        "quant_block_elems": (i32, [i32]),
        "quant_block_bytes": (i32, [i32]),
        "quant_best_isa": (i32, []),
    }
    _declare(lib, signatures)
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
            with _build_lock(target):  # processes starting at once build it once
                if not target.exists():
                    _build(compiler, target, sources, flags)
        except (OSError, subprocess.CalledProcessError) as exc:
            logger.warning("building %s failed (%s): using the torch path", name, exc)
            return None
    return ctypes.CDLL(str(target))


@contextlib.contextmanager
def _build_lock(target: Path) -> Iterator[None]:
    """Hold an exclusive lock on `target`'s lock file (where `fcntl` exists): the stage and
    worker processes of a pipeline's first start all load the kernels at once, and each
    build takes seconds of both cores; the first builds, the others wait and load it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX: concurrent builders each build (the rename is atomic)
        yield
        return
    with open(target.with_name(target.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build(compiler: str, target: Path, sources: list[Path], flags: tuple[str, ...]) -> None:
    """Each source compiled to an object file at once (the quantized library's largest file
    alone takes most of its build), then linked."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        objects = [Path(tmp) / f"{src.stem}.o" for src in sources]
        commands = [
            [compiler, *flags, "-fPIC", "-c", str(src), "-o", str(obj)]
            for src, obj in zip(sources, objects, strict=True)
        ]
        with ThreadPoolExecutor(max_workers=min(len(commands), os.cpu_count() or 1)) as pool:
            for done in pool.map(_compile, commands):
                done.check_returncode()
        out = Path(tmp) / target.name
        link = [compiler, *flags, "-shared", *map(str, objects), "-o", str(out), "-lm"]
        subprocess.run(link, check=True, capture_output=True)
        os.replace(out, target)  # atomic: concurrent builders never see half a library
    logger.info("built C kernels: %s", target)


def _compile(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True)
