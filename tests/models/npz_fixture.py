"""Reference fixtures stored as `.npz`, and the check that a tiny checkpoint is the one a
fixture was made from (its files' SHA-256 in the fixture's `meta`)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np


def load_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def checked_checkpoint(path: Path, fixture: dict[str, Any]) -> Path:
    """`path`, once each file the fixture names has the fixture's digest."""
    for name, digest in json.loads(str(fixture["meta"]))["sha256"].items():
        assert hashlib.sha256((path / name).read_bytes()).hexdigest() == digest, name
    return path
