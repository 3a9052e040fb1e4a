"""`omnistage bench soak`: a long mixed load with aborts on `omnistage serve`, proving
that sync, async and speculative scheduling give the same outputs and leak nothing.

    omnistage bench soak [--generations 20480] [--concurrency 16] [--abort-fraction 0.2]
                         [--seed 0] [--out FILE] [--kinds text,omni,image]
                         [--modes sync,async,spec] [--mix text=0.5,omni=0.25,image=0.25]

Workload (`soak_workload`, seeded): text chat / completions on a tiny random llama
(greedy and seeded sampling, streamed and whole), demo-omni chats answering in text and
speech, demo-image generations; `--abort-fraction` of them given up by the client (a
stream dropped after a few events, a whole answer's connection closed before it comes).
`--generations` counts every generation run, all modes together: each kind gets its
`--mix` share, split evenly over the modes (`soak_servers`: sync, async, async + n-gram
speculation on every autoregressive stage that takes drafts).

For each kind and mode, one `omnistage serve` (stage processes for the pipelines, or
`--in-process`) on a free loopback port: a warm-up, the counters read (`soak_probe`),
the kind's requests sent with `--concurrency` in flight while the server's RSS is
sampled, then a wait for idle and the counters read again; then SIGINT, and the
connector's /dev/shm segments counted once more after the server has gone. Every
completed generation is reduced to a digest (text, finish reason, tokens, audio and
image hashes) and compared across modes by its request's key (`soak_report`).

Reported: a table per server, the comparison per kind, one JSON line (generations per
mode, mismatches, aborts, errors, the counters at the end, leaks, RSS start / peak / end
and slope, wall time, the CPU); `--out FILE` gets everything, RSS curves and every
generation's digest per mode included. Exit status 1 on any mismatch or leak (a request
that fails the same way in every mode is listed under `errors`; failing in one mode
only is a mismatch).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from omnistage.benchmarks.serve import running
from omnistage.benchmarks.soak_client import Outcome, run_load, send
from omnistage.benchmarks.soak_probe import Counters, Probe, RssSampler
from omnistage.benchmarks.soak_report import compare, print_table, rss_summary, server_summary
from omnistage.benchmarks.soak_servers import MODES, ServerPlan, plan
from omnistage.benchmarks.soak_workload import KINDS, SoakRequest, make_workload

DEFAULT_MIX = "text=0.5,omni=0.25,image=0.25"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--generations", type=int, default=20480, help="all modes together")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    parser.add_argument("--abort-fraction", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write every figure and digest here (JSON)")
    parser.add_argument("--kinds", default=",".join(KINDS), help="of text, omni, image")
    parser.add_argument("--modes", default=",".join(MODES), help="of sync, async, spec")
    parser.add_argument("--mix", default=DEFAULT_MIX, help="each kind's share of generations")
    parser.add_argument("--text-model", default=None, help="default: a tiny random llama")
    parser.add_argument("--in-process", action="store_true", help="pipelines: no stage processes")
    parser.add_argument("--parallel", type=int, default=1, help="servers run at the same time")
    parser.add_argument("--launch-timeout", type=float, default=600.0, help="for /health, s")
    parser.add_argument("--idle-timeout", type=float, default=60.0, help="after the load, s")
    parser.add_argument("--rss-interval", type=float, default=0.5, help="RSS sampling, s")
    parser.add_argument("--rss-points", type=int, default=40, help="points of each RSS curve")


def _choices(text: str, known: tuple[str, ...], flag: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in known]
    if not names or unknown:
        raise ValueError(f"{flag}: expected some of {', '.join(known)}, got {text!r}")
    return names


def _mix(text: str, kinds: tuple[str, ...]) -> dict[str, float]:
    shares: dict[str, float] = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        try:
            shares[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--mix: expected kind=share,..., got {text!r}") from None
    shares = {k: v for k, v in shares.items() if k in kinds and v > 0}
    if not shares or any(k not in KINDS for k in shares):
        raise ValueError(f"--mix: no positive share for any of --kinds in {text!r}")
    total = sum(shares.values())
    return {k: v / total for k, v in shares.items()}


def check(args: argparse.Namespace) -> tuple[dict[str, tuple[str, ...]], dict[str, int]]:
    """Validate the flags; each kind's modes and its number of requests (each run in every
    one of its modes)."""
    kinds = _choices(args.kinds, KINDS, "--kinds")
    modes = _choices(args.modes, MODES, "--modes")
    for name in ("generations", "concurrency", "rss_points", "parallel"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}: must be at least 1")
    if not 0.0 <= args.abort_fraction < 1.0:
        raise ValueError("--abort-fraction: must be in [0, 1)")
    mix = _mix(args.mix, kinds)
    if len(modes) < 2:
        raise ValueError("--modes: at least two, to compare")
    kind_modes = {k: modes for k in mix}
    counts = {k: math.ceil(args.generations * mix[k] / len(kind_modes[k])) for k in mix}
    return kind_modes, counts


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _warm_up(base_url: str, requests: list[SoakRequest]) -> None:
    """A whole and a streamed request (not counted), so that lazily opened files, pools
    and caches are there before the counters' baseline is read."""
    import httpx

    picked = {r.stream: r for r in reversed(requests) if r.abort is None}
    async with httpx.AsyncClient(base_url=base_url + "/", timeout=600, trust_env=False) as client:
        for request in picked.values():
            outcome = await send(client, request)
            if outcome.status != "completed":  # the load will say whether it was the server
                print(f"warm-up request {request.key}: {outcome.error}", file=sys.stderr)


def run_server(
    server: ServerPlan, requests: list[SoakRequest], args: argparse.Namespace
) -> tuple[list[Outcome], dict[str, Any]]:
    """One server's whole run: start, warm up, load (in two halves, idle between), stop."""
    port = _free_port()
    base = f"http://127.0.0.1:{port}/v1"
    cmd = [*server.command, "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    print(f"-- {server.kind} / {server.mode}: {len(requests)} requests", flush=True)
    launch = time.perf_counter()
    with running(cmd, base, args.launch_timeout) as proc:
        up = time.perf_counter()
        probe = Probe(proc.pid, base, server.shm_connector)
        asyncio.run(_warm_up(base, requests))
        baseline, loaded = probe.snapshot(), time.perf_counter()
        outcomes, looks, wall, idle_s, sampler = _load(probe, base, requests, baseline, args)
        stop = time.perf_counter()
    summary = {"kind": server.kind, "mode": server.mode, "start_s": round(up - launch, 1)}
    summary["warm_up_s"] = round(loaded - up, 1)
    summary["stop_s"] = round(time.perf_counter() - stop, 1)
    looks = [c.as_dict() for c in (baseline, *looks)]
    summary |= server_summary(outcomes, wall, looks, idle_s)
    summary["rss"] = rss_summary(sampler.points, args.rss_points)
    summary["shm_segments_after_exit"] = after = probe.shm_segments()
    if after:
        summary["leaks"]["shm_segments_after_exit"] = after
    return outcomes, summary


def _load(
    probe: Probe,
    base: str,
    requests: list[SoakRequest],
    baseline: Counters,
    args: argparse.Namespace,
) -> tuple[list[Outcome], list[Counters], float, float, RssSampler]:
    """The requests in two halves, each followed by a wait for idle and a look at the
    counters; returns the outcomes, the two looks (halfway, end), the load's wall time
    (idle waits excluded), the last wait and the RSS samples."""
    done, outcomes, looks, wall, idle_s = 0, [], [], 0.0, 0.0

    def count(_: Outcome) -> None:
        nonlocal done
        done += 1

    half = len(requests) // 2
    with RssSampler(probe, args.rss_interval, lambda: done) as sampler:
        for part in (requests[:half], requests[half:]):
            start = time.perf_counter()
            outcomes += asyncio.run(run_load(base, part, args.concurrency, count))
            wall += time.perf_counter() - start
            look, idle_s = probe.wait_idle(baseline.processes, args.idle_timeout)
            looks.append(look)
    return outcomes, looks, wall, idle_s, sampler


def _run_all(
    plans: dict[tuple[str, str], ServerPlan], workload: list[SoakRequest], args: argparse.Namespace
) -> dict[tuple[str, str], tuple[list[Outcome], dict[str, Any]]]:
    """Every (kind, mode) server's run, `--parallel` of them at a time."""
    from concurrent.futures import ThreadPoolExecutor

    def one(job: tuple[str, str]) -> tuple[list[Outcome], dict[str, Any]]:
        return run_server(plans[job], [r for r in workload if r.kind == job[0]], args)

    with ThreadPoolExecutor(args.parallel, thread_name_prefix="soak-server") as pool:
        return dict(zip(plans, pool.map(one, plans), strict=True))


def _cpu() -> dict[str, Any]:
    from omnistage.benchmarks.startup import cpu_flags

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"model": model, "cores": os.cpu_count(), "flags": cpu_flags()}


def main(args: argparse.Namespace) -> int:
    kind_modes, counts = check(args)
    started = time.perf_counter()
    servers, comparisons, digests = [], {}, {}
    with tempfile.TemporaryDirectory(prefix="omnistage-soak-") as workdir:
        plans = {
            (k, m): plan(k, m, Path(workdir), args.text_model, args.in_process)
            for k, modes in kind_modes.items()
            for m in modes
        }
        names = {k: plans[k, modes[0]].model_name for k, modes in kind_modes.items()}
        workload = make_workload(counts, args.seed, args.abort_fraction, names)
        runs = _run_all(plans, workload, args)
    for kind, modes in kind_modes.items():
        by_mode = {mode: runs[kind, mode][0] for mode in modes}
        servers += [runs[kind, mode][1] for mode in modes]
        comparisons[kind] = compare(by_mode)
        digests[kind] = {m: {o.key: o.digest for o in by_mode[m] if o.digest} for m in by_mode}
    result = _result(args, kind_modes, counts, servers, comparisons, time.perf_counter() - started)
    print_table(servers, comparisons)
    if args.out:
        full = result | {"servers": servers, "comparisons": comparisons, "digests": digests}
        Path(args.out).write_text(json.dumps(full, indent=1))
    print(json.dumps(result))
    return 0 if result["ok"] else 1


def _result(
    args: argparse.Namespace,
    kind_modes: dict[str, tuple[str, ...]],
    counts: dict[str, int],
    servers: list[dict[str, Any]],
    comparisons: dict[str, dict],
    wall: float,
) -> dict[str, Any]:
    """The final JSON line."""
    per_mode: dict[str, int] = {}
    for s in servers:
        per_mode[s["mode"]] = per_mode.get(s["mode"], 0) + s["generations"]
    name = lambda s: f"{s['kind']}/{s['mode']}"  # noqa: E731
    mismatches = sum(c["mismatches"] for c in comparisons.values())
    errors = sum(s["error"] for s in servers)
    by_message: dict[str, int] = {}
    for s in servers:
        for message, n in s["errors"].items():
            by_message[message] = by_message.get(message, 0) + n
    leaks = {name(s): s["leaks"] for s in servers if s["leaks"]}
    return {
        "benchmark": "soak",
        "workload": {
            "seed": args.seed,
            "concurrency": args.concurrency,
            "abort_fraction": args.abort_fraction,
            "requests_per_kind": counts,
            "modes": kind_modes,
            "in_process": args.in_process,
            "text_model": args.text_model or "tiny random llama, float64",
        },
        "generations": sum(s["generations"] for s in servers),
        "generations_per_mode": per_mode,
        "completed": sum(s["completed"] for s in servers),
        "aborts": sum(s["aborted"] for s in servers),
        "aborted_after_answer": sum(s["aborted_after_answer"] for s in servers),
        "errors": errors,
        "errors_by_message": by_message,
        "compared": sum(c["compared"] for c in comparisons.values()),
        "mismatches": mismatches,
        "first_mismatches": [m for c in comparisons.values() for m in c["first_mismatches"]][:5],
        "counters_at_end": {name(s): _brief(s["counters_at_end"]) for s in servers},
        "leaks": leaks,
        "rss": {name(s): {k: v for k, v in s["rss"].items() if k != "curve"} for s in servers},
        "speculation": {
            name(s): s["counters_at_end"]["speculation"]
            for s in servers
            if s["counters_at_end"]["speculation"]
        },
        "wall_s": round(wall, 1),
        "cpu": _cpu(),
        # An error that is not a mismatch is the same answer to its request in every mode.
        "ok": mismatches == 0 and not leaks,
    }


def _brief(counters: dict[str, Any]) -> dict[str, Any]:
    """The counters at the end, the per-stage gauges summed over stages (`held`: a
    pipeline's resource gauges and open requests, summed)."""
    stages = counters["stages"].values()
    out = {g: sum(s.get(g, 0) for s in stages) for g in ("waiting", "running")}
    out["kv_usage"] = max((s.get("kv_usage", 0) for s in stages), default=0)
    gauges = {"waiting", "running", "kv_usage"}
    out["held"] = sum(v for s in stages for k, v in s.items() if k not in gauges)
    return out | {k: counters[k] for k in ("shm_segments", "fds", "threads", "processes")}
