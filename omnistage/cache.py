"""Where omnistage keeps what it builds once: converted checkpoints, compiled kernels."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """`$OMNISTAGE_CACHE_DIR`, else `~/.cache/omnistage`."""
    root = os.environ.get("OMNISTAGE_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "omnistage"
