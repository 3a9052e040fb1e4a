"""`omnistage bench soak`'s findings: the cross-mode comparison of every generation, the
RSS curve with its slope, the per-server summary and the human table.

A generation is compared wherever it was answered in at least two of its kind's modes
(an error answer included: its message is compared); a mismatch is a key whose answers
differ in any of them (the first few are listed with each mode's answer). A request
the workload gives up is never compared, so a request not given up is answered in every
mode, and an error in one mode is either the same error in all (the server's answer to
that request, reported under `errors`) or a mismatch. RSS: the server's process tree, sampled through the
load; the curve is thinned to `points` points, the slope is a least-squares fit of RSS
against generations done over the second half of the samples (after warm-up growth),
in MB per 1,000 generations.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from omnistage.benchmarks.soak_client import Outcome

FIRST_MISMATCHES = 5


def compare(by_mode: Mapping[str, Sequence[Outcome]]) -> dict[str, Any]:
    """Compare one kind's outcomes across its modes (mode -> outcomes)."""
    answers: dict[str, dict[str, Outcome]] = {}
    for mode, outcomes in by_mode.items():
        for outcome in outcomes:
            if outcome.status != "aborted":  # an error is an answer too
                answers.setdefault(outcome.key, {})[mode] = outcome
    compared = every = 0
    mismatches: list[dict[str, Any]] = []
    for key in sorted(answers, key=_natural):
        done = answers[key]
        if len(done) < 2:
            continue
        compared += 1
        every += len(done) == len(by_mode)
        if len({o.digest for o in done.values()}) > 1:
            mismatches.append({"key": key} | {m: _short(o.record) for m, o in done.items()})
    return {
        "compared": compared,
        "compared_in_every_mode": every,
        "mismatches": len(mismatches),
        "first_mismatches": mismatches[:FIRST_MISMATCHES],
    }


def _natural(key: str) -> tuple[str, int]:
    kind, _, index = key.rpartition("-")
    return kind, int(index) if index.isdigit() else 0


def _short(record: dict[str, Any] | None) -> dict[str, Any]:
    out = dict(record or {})
    if isinstance(out.get("text"), str) and len(out["text"]) > 60:
        out["text"] = out["text"][:60] + "..."
    return out


def rss_summary(points: Sequence[tuple[float, int, float, int]], keep: int) -> dict[str, Any]:
    """Start, peak, end, the slope and the thinned curve of (seconds, generations done,
    RSS MB, shm segments) samples."""
    if not points:
        return {"start_mb": None, "peak_mb": None, "end_mb": None, "slope_mb_per_1k": None}
    rss = [p[2] for p in points]
    half = points[len(points) // 2 :]
    slope = None
    xs, ys = [p[1] for p in half], [p[2] for p in half]
    if len(set(xs)) > 1:
        fit = statistics.linear_regression(xs, ys)
        slope = round(fit.slope * 1000, 3)
    step = max(1, len(points) // keep)
    curve = [[round(t, 1), n, round(mb, 1)] for t, n, mb, _ in points[::step]]
    if curve[-1][0] != round(points[-1][0], 1):
        curve.append([round(points[-1][0], 1), points[-1][1], round(points[-1][2], 1)])
    return {
        "start_mb": round(rss[0], 1),
        "peak_mb": round(max(rss), 1),
        "end_mb": round(rss[-1], 1),
        "slope_mb_per_1k": slope,
        "shm_segments_peak": max(p[3] for p in points),
        "curve": curve,
    }


def server_summary(
    outcomes: Sequence[Outcome], wall_s: float, looks: Sequence[dict], idle_s: float
) -> dict[str, Any]:
    """One server's load: counts, failures, and what its counters did (`looks`: the
    counters after the warm-up, halfway and at the end, each at idle)."""
    count = {s: sum(o.status == s for o in outcomes) for s in ("completed", "aborted", "error")}
    errors: dict[str, int] = {}
    for o in outcomes:
        if o.status == "error":
            errors[o.error or "?"] = errors.get(o.error or "?", 0) + 1
    baseline, halfway, final = looks
    return {
        "generations": len(outcomes),
        **count,
        "aborted_after_answer": sum(o.raced for o in outcomes),
        "errors": dict(sorted(errors.items(), key=lambda e: -e[1])[:5]),
        "error_keys": [o.key for o in outcomes if o.status == "error"][:5],
        "wall_s": round(wall_s, 1),
        "generations_per_s": round(len(outcomes) / wall_s, 2) if wall_s else None,
        "counters_after_warmup": baseline,
        "counters_halfway": halfway,
        "counters_at_end": final,
        "idle_after_s": round(idle_s, 2),
        "leaks": leaks(baseline, halfway, final),
    }


def leaks(baseline: dict, halfway: dict, final: dict) -> dict[str, float]:
    """What did not come back: a per-stage gauge or shm segment left at either idle look,
    more processes than after the warm-up, or descriptors that grew in both halves."""
    out: dict[str, float] = {}
    for look in (halfway, final):
        for stage, gauges in look["stages"].items():
            out |= {f"{stage}.{g}": v for g, v in gauges.items() if v}
        if look["shm_segments"]:
            out["shm_segments"] = look["shm_segments"]
    if final["processes"] != baseline["processes"]:
        out["processes"] = final["processes"] - baseline["processes"]
    if halfway["fds"] > baseline["fds"] and final["fds"] > halfway["fds"]:
        out["fds"] = final["fds"] - baseline["fds"]
    return out


def print_table(servers: Sequence[dict[str, Any]], comparisons: Mapping[str, dict]) -> None:
    head = f"{'kind':<6}{'mode':<6}{'gens':>7}{'done':>7}{'abort':>7}{'err':>5}{'gen/s':>8}"
    print(head + f"{'rss MB start/peak/end':>24}{'MB/1k':>10}  leaks")
    for s in servers:
        rss = s["rss"]
        mb = f"{rss['start_mb']}/{rss['peak_mb']}/{rss['end_mb']}"
        print(
            f"{s['kind']:<6}{s['mode']:<6}{s['generations']:>7}{s['completed']:>7}"
            f"{s['aborted']:>7}{s['error']:>5}"
            f"{s['generations_per_s'] or 0:>8.1f}{mb:>24}{rss['slope_mb_per_1k'] or 0:>10.2f}"
            f"  {s['leaks'] or 'none'}"
        )
    for kind, c in comparisons.items():
        print(
            f"{kind}: {c['compared']} generations compared across modes "
            f"({c['compared_in_every_mode']} in every mode), {c['mismatches']} mismatches"
        )
        for m in c["first_mismatches"]:
            print(f"  mismatch {m}")
