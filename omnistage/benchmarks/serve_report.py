"""`omnistage bench serve`'s report: percentiles and the per-level summary of the
results, the machine line, and the human table (the JSON line is `serve.main`'s).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import platform
import shutil
import subprocess
from collections import Counter
from typing import Any

from omnistage.benchmarks.serve_requests import Result

PERCENTILES = (50, 90, 99)


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(results: list[Result], wall: float, sample_rate: int) -> dict[str, Any]:
    ok = [r for r in results if r.error is None]
    tokens = sum(r.output_tokens for r in ok)
    samples = {
        "ttft": [r.ttft for r in ok if r.ttft is not None],
        "tpot": [
            (r.e2e - r.ttft) / (r.output_tokens - 1)
            for r in ok
            if r.ttft is not None and r.output_tokens > 1
        ],
        "itl": [gap for r in ok for gap in r.itl],
        "e2e": [r.e2e for r in ok],
        "ttfa": [r.ttfa for r in ok if r.ttfa is not None],
    }
    out: dict[str, Any] = {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "wall_s": round(wall, 4),
        "request_throughput": round(len(ok) / wall, 4),
        "output_token_throughput": round(tokens / wall, 2),
        "total_output_tokens": tokens,
        "requests_without_usage": sum(not r.had_usage for r in ok if r.ttft is not None),
    }
    for name, xs in samples.items():
        out[f"{name}_mean_ms"] = round(1000 * sum(xs) / len(xs), 3) if xs else None
        for q in PERCENTILES:
            out[f"{name}_p{q}_ms"] = round(1000 * percentile(xs, q), 3) if xs else None
    audio = [(r.e2e, r.audio_bytes / 2 / sample_rate) for r in ok if r.audio_bytes]
    if audio:
        rtf = [e2e / seconds for e2e, seconds in audio]
        out["audio_s"] = round(sum(s for _, s in audio), 4)
        out["rtf_mean"] = round(sum(rtf) / len(rtf), 4)
        out |= {f"rtf_p{q}": round(percentile(rtf, q), 4) for q in PERCENTILES}
    errors = Counter(r.error for r in results if r.error is not None)
    out["errors"] = dict(errors.most_common(5))
    return out


def describe_machine(args: argparse.Namespace) -> str:
    client = (
        f"client {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, httpx {importlib.metadata.version('httpx')}"
    )
    if not args.launch:
        return f"{client}; server {args.base_url} (not started here)"
    gpu = "no GPU"
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
        run = subprocess.run(query, capture_output=True, text=True, check=False)
        gpu = "; ".join(run.stdout.strip().splitlines()) or gpu
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        gpu += f", torch {importlib.metadata.version('torch')}"
    return f"{client}; server launched here ({gpu}): omnistage serve {args.serve_args}".strip()


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'level':>9}{'ok/total':>10}{'req/s':>9}{'out tok/s':>11}{'wall s':>9}")
    for row in rows:
        done = f"{row['completed']}/{row['completed'] + row['failed']}"
        print(
            f"{row['concurrency'] or 'rate':>9}{done:>10}{row['request_throughput']:>9.2f}"
            f"{row['output_token_throughput']:>11.1f}{row['wall_s']:>9.2f}"
        )
    print(f"{'ms':<5}{'level':>9}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}")
    for name in ("ttft", "tpot", "itl", "e2e", "ttfa"):
        for row in rows:
            if row[f"{name}_mean_ms"] is None:
                continue
            cells = [row[f"{name}_{k}_ms"] for k in ("mean", "p50", "p90", "p99")]
            print(
                f"{name:<5}{row['concurrency'] or 'rate':>9}"
                + "".join(f"{c:>10.1f}" for c in cells)
            )
    for row in rows:
        if "rtf_mean" in row:
            print(
                f"RTF at {row['concurrency'] or 'rate'}: mean {row['rtf_mean']:.3f}, p50 "
                f"{row['rtf_p50']:.3f}, p99 {row['rtf_p99']:.3f} ({row['audio_s']:.1f} audio s)"
            )
        for error, count in row["errors"].items():
            print(f"failed at {row['concurrency'] or 'rate'}: {count} x {error}")
