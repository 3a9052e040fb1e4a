"""The forward context: per-pass metadata that attention layers read.

Models keep a plain `forward(input_ids, positions)`; the runner enters
`forward_context(meta)` around the call and attention layers fetch the
metadata with `get_forward_context()`. Nesting is refused so a stale context
can never leak into another pass (STYLE.md 7).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_local = threading.local()


@contextmanager
def forward_context(metadata: Any) -> Iterator[None]:
    if getattr(_local, "metadata", None) is not None:
        raise RuntimeError("forward_context: nested forward passes are not allowed")
    _local.metadata = metadata
    try:
        yield
    finally:
        _local.metadata = None


def get_forward_context() -> Any:
    metadata = getattr(_local, "metadata", None)
    if metadata is None:
        raise RuntimeError("attention called outside a forward_context")
    return metadata
