"""`omnistage bench serve --peer ...`: the same load against a peer server, in the same run.

A ratio of two benchmark runs taken minutes apart on a shared machine says little (its
speed drifts by tens of percent), so the peer and omnistage are measured one after the
other by one command, with the same prompts, levels and client: the peer first
(`llama-server` started from `--llama-server` and `--peer-model`, or any command given
as `--peer-command` with `{host}` and `{port}` in it, e.g. `vllm serve ...`), then
`omnistage serve` (`--launch`). Each server runs alone: the machine's cores are the
servers' and the client's only.

This module owns the peer's flags, its command line and the comparison: per level, ours
/ the peer's output tokens/s, TPOT and TTFT p50, and the two targets of issue 19 where
their levels were measured (c=1 TPOT p50 at most the peer's; c=64 output tokens/s at
least 1.5x the peer's).
"""

from __future__ import annotations

import argparse
import os
import shlex
from typing import Any

PEERS = ("llamacpp", "command")
C64_OUTPUT_TARGET = 1.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--peer", choices=PEERS, default=None, help="also measure a peer server (needs --launch)"
    )
    parser.add_argument("--llama-server", default=None, help="--peer llamacpp: the binary")
    parser.add_argument("--peer-model", default=None, help="--peer llamacpp: the GGUF file")
    parser.add_argument("--peer-args", default="", help="--peer llamacpp: more flags")
    parser.add_argument(
        "--peer-command", default=None, help="--peer command: a command line with {host} {port}"
    )
    parser.add_argument(
        "--peer-port", type=int, default=None, help="default: the base URL's port + 1"
    )


def check(args: argparse.Namespace) -> None:
    """Name the flag that is missing or wrong (a ValueError: the CLI prints it, exit 2)."""
    if args.peer is None:
        return
    if not args.launch:
        raise ValueError("--peer: needs --launch (both servers are started here, one at a time)")
    if args.peer == "llamacpp":
        for flag in ("llama_server", "peer_model"):
            path = getattr(args, flag)
            if not path or not os.path.exists(path):
                raise ValueError(f"--{flag.replace('_', '-')}: a file is needed, got {path!r}")
    elif not args.peer_command or "{port}" not in args.peer_command:
        raise ValueError("--peer-command: expected a command line with {port} (and {host})")


def command(args: argparse.Namespace, host: str, port: int, levels: list[int | None]) -> list[str]:
    """The peer's command line. llama-server gets one slot per request in flight at the
    highest level and a context of that many slots of `slot_tokens` (prompt + output)."""
    if args.peer == "command":
        return shlex.split(args.peer_command.format(host=host, port=port))
    slots = max([c for c in levels if c] or [1])
    slot_tokens = max(512, 4 * args.input_words + args.max_tokens + 64)
    threads = str(os.cpu_count() or 1)
    return [
        args.llama_server,
        *("-m", args.peer_model, "--host", host, "--port", str(port), "-t", threads),
        *("-np", str(slots), "-c", str(slots * slot_tokens), "--jinja"),
        *shlex.split(args.peer_args),
    ]


def compare(ours: list[dict[str, Any]], peer: list[dict[str, Any]]) -> dict[str, Any]:
    """Per level: ours / the peer's (output tok/s; TPOT and TTFT p50: below 1 is faster),
    and the targets whose levels were measured."""
    levels = []
    for mine, theirs in zip(ours, peer, strict=True):
        row: dict[str, Any] = {"concurrency": mine["concurrency"]}
        for key in ("output_token_throughput", "tpot_p50_ms", "ttft_p50_ms"):
            a, b = mine.get(key), theirs.get(key)
            row[f"{key}_ratio"] = round(a / b, 3) if a is not None and b else None
        levels.append(row)
    by_level = {row["concurrency"]: row for row in levels}
    targets: dict[str, bool | None] = {}
    if 1 in by_level and by_level[1]["tpot_p50_ms_ratio"] is not None:
        targets["c1_tpot_at_most_peer"] = by_level[1]["tpot_p50_ms_ratio"] <= 1.0
    if 64 in by_level and by_level[64]["output_token_throughput_ratio"] is not None:
        ratio = by_level[64]["output_token_throughput_ratio"]
        targets[f"c64_output_at_least_{C64_OUTPUT_TARGET}x_peer"] = ratio >= C64_OUTPUT_TARGET
    return {"ratios": levels, "targets": targets}


def print_comparison(name: str, comparison: dict[str, Any]) -> None:
    print(f"ours / {name}:{'level':>8}{'out tok/s':>11}{'TPOT p50':>10}{'TTFT p50':>10}")
    for row in comparison["ratios"]:
        cells = [
            row[k]
            for k in ("output_token_throughput_ratio", "tpot_p50_ms_ratio", "ttft_p50_ms_ratio")
        ]
        text = "".join(f"{'-' if c is None else f'{c:.3f}x':>10}" for c in cells)
        print(f"{'':>{len(name) + 7}}{row['concurrency'] or 'rate':>8} {text}")
    for target, met in comparison["targets"].items():
        print(f"target {target}: {'met' if met else 'not met'}")
