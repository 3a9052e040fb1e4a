"""The on-disk cache of GGUF files converted to HF checkpoints (see `gguf_loader`).

`cached_gguf_checkpoint(path)` returns the converted directory, converting on
first use into a temporary sibling that is renamed into place (atomic: a
concurrent process never sees half a cache). The directory is keyed by the
GGUF's SHA-256 (`content_digest`). A marker file records the converter's
fingerprint and every file's size; a stale or damaged cache is rebuilt.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import tempfile
from pathlib import Path

from omnistage.cache import build_into_place, cache_root

_CONVERTER_SOURCES = tuple(Path(__file__).with_name(n) for n in ("gguf_loader.py", "gguf_names.py"))
"""The converter (imported only to convert: checking a cache must not import transformers)."""

logger = logging.getLogger("omnistage")

_CACHE_VERSION = 1
_MARKER = "omnistage-gguf.json"


def _identity(gguf_path: Path) -> dict:
    return {"source": str(gguf_path), "sha256": content_digest(gguf_path)}


def content_digest(path: Path) -> str:
    """The SHA-256 of the file's bytes, remembered per (path, size, mtime, inode) under the
    cache dir: a file is read once to hash it (~0.1 s per 100 MB), not on every start."""
    st = path.stat()
    stamp = f"{path}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
    memo = cache_root() / "file-digests" / hashlib.sha256(stamp.encode()).hexdigest()[:24]
    with contextlib.suppress(OSError):
        known = memo.read_text()
        if len(known) == 64:
            return known
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    with contextlib.suppress(OSError):  # a read-only cache only costs the hashing again
        memo.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".digest-", dir=memo.parent)
        with os.fdopen(fd, "w") as out:
            out.write(digest)
        os.replace(tmp, memo)
    return digest


def gguf_cache_dir(gguf_path: Path) -> Path:
    """Where the converted checkpoint of `gguf_path` lives (whether or not it exists yet):
    named by the file's content, so a changed file gets a new one and copies share one."""
    gguf_path = Path(gguf_path).resolve()
    return cache_root() / "gguf" / f"{gguf_path.stem}-{content_digest(gguf_path)[:16]}"


@functools.cache
def converter_fingerprint() -> str:
    """Identifies the code that converts: gguf_loader's source and the library versions.

    Stored in the cache marker; a cache written by other code is rebuilt, so a
    fix to the conversion (or a transformers upgrade that changes the
    tokenizer) cannot leave a stale checkpoint behind.
    """
    h = hashlib.sha256()
    for source in _CONVERTER_SOURCES:
        h.update(source.read_bytes())
    versions = f"{_version('transformers')}|{_version('gguf')}"
    h.update(f"{_CACHE_VERSION}|{versions}".encode())
    return h.hexdigest()[:16]


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _is_complete(out_dir: Path) -> bool:
    """The marker is present, written by this converter, and every file it lists has its size."""
    try:
        marker = json.loads((out_dir / _MARKER).read_text())
        files = marker["files"]
        return marker["converter"] == converter_fingerprint() and all(
            (out_dir / name).stat().st_size == size for name, size in files.items()
        )
    except (OSError, ValueError, KeyError, TypeError):
        return False


def cached_gguf_checkpoint(gguf_path: Path) -> Path:
    """The converted checkpoint directory of `gguf_path`, converting it on first use.

    Silent when the cache is there; logs one line when converting. An
    incomplete or damaged cache directory is rebuilt.
    """
    gguf_path = Path(gguf_path).resolve()
    final = gguf_cache_dir(gguf_path)
    if _is_complete(final):
        return final
    logger.info(
        "converting %s to an HF checkpoint in %s (once; later starts reuse it)", gguf_path, final
    )

    def build(tmp: Path) -> None:
        from omnistage.models import gguf_loader

        gguf_loader.convert_gguf(gguf_path, tmp)
        files = {p.name: p.stat().st_size for p in tmp.iterdir()}
        marker = {"converter": converter_fingerprint(), **_identity(gguf_path), "files": files}
        (tmp / _MARKER).write_text(json.dumps(marker, indent=2))

    build_into_place(final, build, _is_complete)
    return final
