"""The on-disk cache of checkpoint folders in a family's own layout, converted to HF's.

Some families ship checkpoints without config.json or safetensors (CosyVoice3: a
HyperPyYAML file and PyTorch state dicts). Their family names a converter
(`Family.layouts`); `cached_layout_view(folder, converter)` runs it once into a temporary
sibling renamed into place (atomic, like the GGUF cache) and returns that directory
afterwards. The directory is keyed by the folder's path and every file's size and
modification time, and by the converter's source: an edited checkpoint or converter gets
a new one.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
from collections.abc import Callable
from pathlib import Path

from omnistage.cache import build_into_place, cache_root

logger = logging.getLogger("omnistage")

_MARKER = "omnistage-layout.json"


def _fingerprint(folder: Path, converter: Callable[[Path, Path], None]) -> str:
    h = hashlib.sha256(str(folder).encode())
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        stat = file.stat()
        h.update(f"|{file.relative_to(folder)}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    h.update(inspect.getsource(inspect.getmodule(converter)).encode())
    return h.hexdigest()[:16]


def _is_complete(out_dir: Path) -> bool:
    try:
        files = json.loads((out_dir / _MARKER).read_text())["files"]
        return all((out_dir / name).stat().st_size == size for name, size in files.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def layout_source(path: Path) -> Path | None:
    """The checkpoint folder a converted view was made from (None for any other folder):
    what outlives the view, whose directory changes with the converter."""
    try:
        return Path(json.loads((Path(path) / _MARKER).read_text())["source"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def cached_layout_view(folder: Path, converter: Callable[[Path, Path], None]) -> Path:
    """The HF view of `folder`, converting it on first use (ValueError from the converter
    names what is wrong with the folder)."""
    folder = Path(folder).resolve()
    final = cache_root() / "layouts" / f"{folder.name}-{_fingerprint(folder, converter)}"
    if _is_complete(final):
        return final
    logger.info("converting %s to an HF view in %s (once; later starts reuse it)", folder, final)

    def build(tmp: Path) -> None:
        converter(folder, tmp)
        files = {str(p.relative_to(tmp)): p.stat().st_size for p in tmp.rglob("*") if p.is_file()}
        (tmp / _MARKER).write_text(json.dumps({"source": str(folder), "files": files}, indent=2))

    build_into_place(final, build, _is_complete)
    return final
