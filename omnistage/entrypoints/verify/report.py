"""`omnistage verify`'s report: the human table (one row per check, then the first
difference of each failed check) and the final JSON line."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from omnistage.entrypoints.verify.checks import FAIL, Check


def print_table(model: str, checks: Sequence[Check]) -> None:
    width = max(len(c.configs) for c in checks) + 2
    print(f"omnistage verify {model}")
    print(f"{'check':<24}{'configurations':<{width}}{'requests':>9}  result")
    for c in checks:
        print(f"{c.name:<24}{c.configs:<{width}}{c.requests:>9}  {c.result}")
    for c in checks:
        if c.note:
            print(f"  {c.name}: {c.note}")
    for c in checks:
        if c.result == FAIL and c.first is not None:
            a, _, b = c.configs.partition(" vs ")
            print(
                f"MISMATCH {c.name} ({c.mismatches} requests differ): first at {c.first.describe(a, b)}"
            )


def result_json(model: str, checks: Sequence[Check], extra: dict[str, Any]) -> dict[str, Any]:
    """The final JSON line: every check, the first mismatch, whether all passed."""
    first = next((c for c in checks if c.result == FAIL and c.first is not None), None)
    return {
        "verify": model,
        "ok": all(c.result != FAIL for c in checks),
        "checks": [
            {k: v for k, v in dataclasses.asdict(c).items() if k != "first"} for c in checks
        ],
        "first_mismatch": None
        if first is None
        else {"check": first.name, **dataclasses.asdict(first.first)},
        **extra,
    }
