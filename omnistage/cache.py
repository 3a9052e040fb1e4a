"""Where omnistage keeps what it builds once: converted checkpoints, compiled kernels."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_root() -> Path:
    """`$OMNISTAGE_CACHE_DIR`, else `~/.cache/omnistage`."""
    root = os.environ.get("OMNISTAGE_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "omnistage"


def build_into_place(
    final: Path, build: Callable[[Path], None], is_complete: Callable[[Path], bool]
) -> None:
    """Build a cache directory atomically: `build` fills a temporary sibling, which is then
    renamed to `final` (a concurrent process never sees half a cache). A stale `final` is
    removed first; if another process renamed its complete copy into place first, that
    one is kept."""
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():
        _discard(final)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        build(tmp)
        try:
            os.replace(tmp, final)
        except OSError:
            if not is_complete(final):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _discard(path: Path) -> None:
    """Remove a stale cache directory; renamed aside first so its removal is atomic."""
    aside = Path(tempfile.mkdtemp(prefix=f".{path.name}.stale-", dir=path.parent))
    with contextlib.suppress(FileNotFoundError):  # someone else removed it already
        os.replace(path, aside / path.name)
    shutil.rmtree(aside, ignore_errors=True)
