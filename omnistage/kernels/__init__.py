"""Small C kernels for the CPU hot path, built on first use and cached.

No torch headers: each kernel is plain C over raw pointers, compiled with the
system C compiler in about a second (`cc -O3 -march=native -ffast-math -fopenmp`; the kernels use no infinities) into
`$OMNISTAGE_CACHE_DIR/kernels/<hash of source, compiler and CPU>/`, and called
through ctypes. Where no compiler is found or the build fails, `load()`
returns None (logged once) and callers use their pure-torch path.
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

from omnistage.cache import cache_root

logger = logging.getLogger("omnistage")

_SOURCES = [Path(__file__).with_name(n) for n in ("paged_attention.c", "rope_cache.c")]
_DISABLE_ENV = "OMNISTAGE_DISABLE_C_KERNELS"


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
    return load_variant()


def load_variant(extra_flags: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """The library built with `extra_flags` added (tests build the generic paths of this
    CPU with e.g. `-mno-avx512f`), or None when it cannot be built here."""
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        logger.info("no C compiler found: using the pure-torch attention path")
        return None
    source = b"".join(p.read_bytes() for p in _SOURCES) + " ".join(extra_flags).encode()
    key = hashlib.sha256(source + compiler.encode() + _cpu_fingerprint().encode()).hexdigest()[:16]
    target = cache_root() / "kernels" / key / "libomnistage_kernels.so"
    if not target.exists():
        try:
            _build(compiler, target, extra_flags)
        except (OSError, subprocess.CalledProcessError) as exc:
            logger.warning("building the C attention kernel failed (%s): using the torch path", exc)
            return None
    lib = ctypes.CDLL(str(target))
    decode_args = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 7 + [ctypes.c_float]
    for fn, last in (
        (lib.paged_decode_attention_f32, ctypes.c_void_p),  # the shared work counter
        (lib.paged_decode_attention_f32_team, ctypes.c_int),  # the team's threads
    ):
        fn.restype = None
        fn.argtypes = [*decode_args, last]
    rope = lib.rope_write_kv_f32
    rope.restype = None
    rope.argtypes = (
        [ctypes.c_void_p]
        + [ctypes.c_int64] * 4
        + [ctypes.c_void_p] * 4
        + [ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]
    )
    lib.paged_decode_limits_ok.restype = ctypes.c_int
    lib.paged_decode_limits_ok.argtypes = [ctypes.c_int64] * 3
    return lib


def _build(compiler: str, target: Path, extra_flags: tuple[str, ...]) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        cmd = [
            compiler,
            "-O3",
            "-march=native",
            "-fopenmp",
            "-ffast-math",
            "-shared",
            "-fPIC",
            *extra_flags,
            *map(str, _SOURCES),
            "-o",
            str(out),
            "-lm",
        ]
        subprocess.run(cmd, check=True, capture_output=True)
        os.replace(out, target)  # atomic: concurrent builders never see half a library
    logger.info("built C attention kernel: %s", target)
