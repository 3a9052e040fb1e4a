"""`omnistage verify`'s checks: two configurations' runs compared request by request,
and the leak and failure checks of every run.

Compared are the workload's requests that are never aborted (an aborted request's
fate depends on timing), in key order; within a request, stage by stage in pipeline
order: the stage's token ids, its finish reason, the digest of its output data, then
the payloads its outgoing edges delivered (each chunk's digest). The first
difference found is kept (`Mismatch`: request, stage, token position).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from omnistage.entrypoints.verify.payloads import Kept, difference, join_chunks, value_difference
from omnistage.entrypoints.verify.results import RunResult, StageTrace

PASS, FAIL, SKIPPED = "pass", "FAIL", "skipped"


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """Where two runs first differ."""

    request: str
    stage: str
    what: str
    """`token`, `length`, `finish_reason`, `data`, `payload <edge>#<chunk>`, `output`."""
    position: int | None
    """The first differing token position (None where the difference is not a token)."""
    expected: str
    got: str

    def describe(self, a: str, b: str) -> str:
        at = f", token position {self.position}" if self.position is not None else ""
        return (
            f"request {self.request}, stage {self.stage}{at}: {self.what} differs "
            f"({a}: {self.expected}, {b}: {self.got})"
        )


@dataclasses.dataclass
class Check:
    """One row of the table."""

    name: str
    configs: str
    requests: int
    result: str
    note: str = ""
    mismatches: int = 0
    first: Mismatch | None = None


def compare_runs(
    name: str, a: RunResult, b: RunResult, keys: list[str], joined: bool = False
) -> Check:
    """`b` against `a` on the requests `keys` (the ones never aborted); `joined`: each
    edge's payloads compared joined (`payloads.join_chunks`), not chunk by chunk."""
    differing = [m for key in keys if (m := first_difference(key, a, b, joined)) is not None]
    return Check(
        name,
        f"{a.config} vs {b.config}",
        len(keys),
        FAIL if differing else PASS,
        mismatches=len(differing),
        first=differing[0] if differing else None,
    )


def first_difference(key: str, a: RunResult, b: RunResult, joined: bool = False) -> Mismatch | None:
    """The first difference between the two runs' outputs of request `key`, or None."""
    ta, tb = a.traces.get(key), b.traces.get(key)
    pa, pb = a.payloads.get(key) or {}, b.payloads.get(key) or {}
    if joined:
        pa, pb = join_chunks(pa), join_chunks(pb)
    if ta is None or tb is None:
        return Mismatch(key, "-", "output", None, _has(ta), _has(tb))
    for stage in a.stages:
        found = _stage_difference(key, stage, ta.get(stage), tb.get(stage))
        if found is None:
            found = _payload_difference(key, stage, pa, pb)
        if found is not None:
            return found
    return None


def _has(traces: object) -> str:
    return "none" if traces is None else "an output"


def _stage_difference(
    key: str, stage: str, sa: StageTrace | None, sb: StageTrace | None
) -> Mismatch | None:
    if sa is None or sb is None:
        return None if sa is sb else Mismatch(key, stage, "output", None, _has(sa), _has(sb))
    for pos, (x, y) in enumerate(zip(sa.token_ids, sb.token_ids, strict=False)):
        if x != y:
            return Mismatch(key, stage, "token", pos, str(x), str(y))
    if len(sa.token_ids) != len(sb.token_ids):
        pos = min(len(sa.token_ids), len(sb.token_ids))
        return Mismatch(
            key, stage, "length", pos, f"{len(sa.token_ids)} tokens", f"{len(sb.token_ids)} tokens"
        )
    for what in ("finish_reason", "data_digest", "error"):
        x, y = getattr(sa, what), getattr(sb, what)
        if what == "data_digest" and x != y and _close_floats(sa.floats, sb.floats):
            continue  # float data from float payloads: rounding, as the payloads allow
        if x != y:
            return Mismatch(key, stage, what.removesuffix("_digest"), None, str(x), str(y))
    return None


def _close_floats(a: Any, b: Any) -> bool:
    """Both float data within the payloads' tolerance of their dtype."""
    return a is not None and b is not None and value_difference(a, b) is None


def _payload_difference(
    key: str, stage: str, pa: Mapping[str, Kept], pb: Mapping[str, Kept]
) -> Mismatch | None:
    def order(name: str) -> tuple[str, int]:
        edge, _, chunk = name.partition("#")
        return edge, int(chunk or 0)

    mine = sorted({k for k in (*pa, *pb) if k.startswith(f"{stage}->")}, key=order)
    for name in mine:
        found = difference(pa.get(name), pb.get(name))
        if found is not None:
            return Mismatch(key, stage, f"payload {name}", None, "-", found)
    return None


def leak_check(runs: Mapping[str, RunResult]) -> Check:
    """Nothing held at the end of any run (KV blocks, requests, rows, accumulator and
    coordinator entries, shm segments)."""
    leaked = {name: run.leaks for name, run in runs.items() if run.leaks}
    note = "; ".join(f"{n}: {leaks}" for n, leaks in leaked.items())
    aborted = max((len(r.aborted) for r in runs.values()), default=0)
    return Check(
        "nothing leaked",
        ", ".join(runs),
        aborted,
        FAIL if leaked else PASS,
        note or f"with {aborted} requests aborted mid-way",
    )


def ended_check(runs: Mapping[str, RunResult], keys: list[str]) -> Check:
    """Every request not aborted ended without an error in every run."""
    failed = {
        f"{name}/{key}": t.error
        for name, run in runs.items()
        for key, traces in run.traces.items()
        for t in traces.values()
        if t.error
    }
    note = "; ".join(f"{k}: {e}" for k, e in list(failed.items())[:3])
    return Check("every request ended", ", ".join(runs), len(keys), FAIL if failed else PASS, note)
