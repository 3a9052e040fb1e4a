"""`omnistage bench throughput`'s report: the workload in words, the table of peers and
the ratios the peers allow (ours / transformers, ours / vLLM, async / sync, speculative /
plain, with the check that speculation left the outputs unchanged)."""

from __future__ import annotations

import argparse
import json
import os
import platform
from typing import Any

import torch

from omnistage.benchmarks.throughput_workloads import parse_input_len

SCHEDULING_PEERS = ("omnistage-sync", "omnistage-async")


def workload_description(args: argparse.Namespace, repeat: int) -> str:
    if args.workload == "repetitive":
        workload = (
            f"best of {repeat}: {args.num_prompts} chat prompts 'return this module with one edit' "
            f"(a 26-line module), up to {args.output_len} output tokens, greedy, stop at EOS, "
            f"dtype {args.dtype}"
        )
    else:
        workload = (
            f"best of {repeat}: {args.num_prompts} prompts x {_lengths(args.input_len)} random tokens, "
            f"{args.output_len} output tokens each, greedy, ignore_eos, dtype {args.dtype}"
        )
    if not args.compare_scheduling:
        mode = "async" if args.async_scheduling else "sync"
        workload += f", {mode} scheduling"
    return workload


def print_table(workload: str, results: dict[str, dict[str, Any]]) -> None:
    print(f"workload: {workload}")
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
    )
    print(f"{'peer':<14}{'output tok/s':>14}{'elapsed s':>12}{'start->1st tok s':>18}")
    for peer, r in results.items():
        print(
            f"{peer:<14}{r['output_tokens_per_s']:>14.1f}{r['elapsed_s']:>12.2f}{r['startup_to_first_token_s']:>18.2f}"
        )


def ratios(args: argparse.Namespace, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Print the comparisons the peers allow; return them for the JSON summary."""
    summary: dict[str, Any] = {}
    if "omnistage" in results and "transformers" in results:
        ratio = (
            results["omnistage"]["output_tokens_per_s"]
            / results["transformers"]["output_tokens_per_s"]
        )
        print(f"omnistage / transformers: {ratio:.2f}x")
        summary["ratio_vs_transformers"] = round(ratio, 3)
    if "omnistage" in results and "vllm" in results:
        ratio = results["omnistage"]["output_tokens_per_s"] / results["vllm"]["output_tokens_per_s"]
        print(f"omnistage / vllm {results['vllm'].get('version', '')}: {ratio:.2f}x")
        summary["ratio_vs_vllm"] = round(ratio, 3)
    if set(SCHEDULING_PEERS) <= set(results):
        ratio = (
            results["omnistage-async"]["output_tokens_per_s"]
            / results["omnistage-sync"]["output_tokens_per_s"]
        )
        print(f"async / sync: {ratio:.2f}x")
        summary["ratio_async_vs_sync"] = round(ratio, 3)
    if "omnistage-spec" in results:
        plain, spec = results["omnistage"], results["omnistage-spec"]
        if plain["outputs_digest"] != spec["outputs_digest"]:
            raise RuntimeError("speculation changed the outputs: the benchmark is void")
        ratio = spec["output_tokens_per_s"] / plain["output_tokens_per_s"]
        print(
            f"speculation: {args.speculative_config}; mean acceptance length "
            f"{spec['mean_acceptance_length']:.2f}, accepted {spec['accepted_tokens']} of "
            f"{spec['draft_tokens']} drafts; spec / no spec: {ratio:.2f}x"
        )
        summary["speculative_config"] = json.loads(args.speculative_config)
        summary["mean_acceptance_length"] = round(spec["mean_acceptance_length"], 3)
        summary["ratio_spec_vs_no_spec"] = round(ratio, 3)
    return summary


def _lengths(input_len: str) -> str:
    low, high = parse_input_len(input_len)
    return str(low) if low == high else f"{low}-{high} (uniform per prompt)"
