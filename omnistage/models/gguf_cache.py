"""The on-disk cache of GGUF files converted to HF checkpoints (see `gguf_loader`).

`cached_gguf_checkpoint(path)` returns the converted directory, converting on
first use into a temporary sibling that is renamed into place (atomic: a
concurrent process never sees half a cache). A marker file records the
converter's fingerprint and every file's size; a stale or damaged cache is
rebuilt.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from omnistage.cache import cache_root

_CONVERTER_SOURCE = Path(__file__).with_name("gguf_loader.py")
"""The converter (imported only to convert: checking a cache must not import transformers)."""

logger = logging.getLogger("omnistage")

_CACHE_VERSION = 1
_MARKER = "omnistage-gguf.json"


def _identity(gguf_path: Path) -> dict:
    st = gguf_path.stat()
    return {"source": str(gguf_path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def gguf_cache_dir(gguf_path: Path) -> Path:
    """Where the converted checkpoint of `gguf_path` lives (whether or not it exists yet)."""
    gguf_path = Path(gguf_path).resolve()
    ident = json.dumps(_identity(gguf_path), sort_keys=True)
    digest = hashlib.sha256(ident.encode()).hexdigest()[:12]
    return cache_root() / "gguf" / f"{gguf_path.stem}-{digest}"


@functools.cache
def converter_fingerprint() -> str:
    """Identifies the code that converts: gguf_loader's source and the library versions.

    Stored in the cache marker; a cache written by other code is rebuilt, so a
    fix to the conversion (or a transformers upgrade that changes the
    tokenizer) cannot leave a stale checkpoint behind.
    """
    h = hashlib.sha256(_CONVERTER_SOURCE.read_bytes())
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
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():
        _discard(final)
    logger.info(
        "converting %s to an HF checkpoint in %s (once; later starts reuse it)", gguf_path, final
    )
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        from omnistage.models import gguf_loader

        gguf_loader.convert_gguf(gguf_path, tmp)
        files = {p.name: p.stat().st_size for p in tmp.iterdir()}
        marker = {"converter": converter_fingerprint(), **_identity(gguf_path), "files": files}
        (tmp / _MARKER).write_text(json.dumps(marker, indent=2))
        try:
            os.replace(tmp, final)
        except OSError:
            # Another process renamed its copy into place first; use that one.
            if not _is_complete(final):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _discard(path: Path) -> None:
    """Remove a stale cache directory; renamed aside first so its removal is atomic."""
    aside = Path(tempfile.mkdtemp(prefix=f".{path.name}.stale-", dir=path.parent))
    with contextlib.suppress(FileNotFoundError):  # someone else removed it already
        os.replace(path, aside / path.name)
    shutil.rmtree(aside, ignore_errors=True)
