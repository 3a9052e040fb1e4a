"""How `omnistage verify` keeps and compares the payloads a stage receives.

Ids, codes, flags and every other non-float value must be equal exactly. Float
tensors (hidden states, embeddings) must have the same shape and dtype and agree
within `TOLERANCE` of their dtype: a step that batches a request with others of
another size sums its rows in another order, which rounds floats differently (by
~1e-12 in float64; see docs/testing.md, "hidden rows within 1e-12"), so only an
exact comparison of the tokens those rows lead to is meaningful. A real bug (a
placeholder row, a row of another request, a row missing) is far outside.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}
"""dtype -> the largest difference allowed, relative to the tensor's largest magnitude
(at least 1)."""

Kept = dict[str, Any]


def keep(payload: Mapping[str, Any]) -> Kept:
    """A copy of `payload` (but its request id) that the stage cannot change later."""
    out: Kept = {}
    for key, value in payload.items():
        if key != "meta.request_id":
            out[key] = value.detach().clone() if isinstance(value, torch.Tensor) else value
    return out


def difference(a: Kept | None, b: Kept | None) -> str | None:
    """What differs between two kept payloads (None: they agree)."""
    if a is None or b is None:
        return None if a is b else f"present in {'the second' if a is None else 'the first'} only"
    if a.keys() != b.keys():
        return f"keys {sorted(a.keys() ^ b.keys())} in one only"
    for key in sorted(a):
        found = value_difference(a[key], b[key])
        if found is not None:
            return f"{key}: {found}"
    return None


def value_difference(x: Any, y: Any) -> str | None:
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        return None if type(x) is type(y) and x == y else f"{x!r} vs {y!r}"
    if x.dtype != y.dtype or x.shape != y.shape:
        return f"{x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}"
    if not x.is_floating_point():
        if torch.equal(x, y):
            return None
        where = (x != y).nonzero()[0].tolist()
        return f"at {where}: {x[tuple(where)].item()} vs {y[tuple(where)].item()}"
    if x.numel() == 0:
        return None
    scale = max(1.0, float(x.abs().max()))
    worst = float((x.double() - y.double()).abs().max())
    if worst <= TOLERANCE.get(x.dtype, 1e-4) * scale or torch.equal(x, y):
        return None
    return f"differs by up to {worst:.3g}"


CHUNKING_KEYS = ("meta.chunk_index", "meta.start_position")
"""Keys that say where a chunk sits in its stream: they depend on how it was cut."""


def join_chunks(chunks: Mapping[str, Kept]) -> dict[str, Kept]:
    """`<edge>#<chunk>` -> payload joined into `<edge>` -> one payload: the rows of each
    tensor key concatenated in chunk order, the last value of every other key. What a
    stream carries, however a step cut it: speculation hands several rows on a step."""
    by_edge: dict[str, list[tuple[int, Kept]]] = {}
    for name, payload in chunks.items():
        edge, _, index = name.rpartition("#")
        by_edge.setdefault(edge, []).append((int(index), payload))
    joined: dict[str, Kept] = {}
    for edge, parts in by_edge.items():
        rows: dict[str, list[torch.Tensor]] = {}
        out: Kept = {}
        for _, payload in sorted(parts, key=lambda p: p[0]):
            for key, value in payload.items():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    rows.setdefault(key, []).append(value)
                elif key not in CHUNKING_KEYS:
                    out[key] = value
        out |= {key: torch.cat(values) for key, values in rows.items()}
        joined[edge] = out
    return joined
