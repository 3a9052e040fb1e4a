"""`omnistage bench throughput`: our engine against HF transformers, same model, same run.

With `--compare-scheduling`, the peers are our engine with synchronous and
with asynchronous scheduling instead. With `--speculative-config JSON`, they
are our engine without and with that speculation (same scheduling), and the
mean acceptance length is reported. `--model tiny-random` uses a tiny random
llama (2 layers, hidden 64) made on first use, where per-step CPU overhead
dominates.

Workloads (seeded):
- `random` (default): N prompts of random token ids, L prompt tokens each, M
  output tokens each with `ignore_eos`;
- `repetitive`: N chat prompts asking to return a given document (a Python
  module) with one small edit, up to M output tokens, greedy, stopping at
  EOS — where outputs copy their input and n-gram lookup finds drafts.

Each peer runs in a fresh subprocess: load the model, serve one short warm-up
request (its first token gives the time from process start to first token),
then the timed workload. The parent prints a table and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from typing import Any

import torch

from omnistage.benchmarks.throughput_workloads import (
    WORKLOADS,
    make_repetitive_workload,
    make_workload,
)

PEERS = ("omnistage", "transformers")
SCHEDULING_PEERS = ("omnistage-sync", "omnistage-async")
SPEC_PEERS = ("omnistage", "omnistage-spec")
TINY_MODEL = "tiny-random"


def resolve_bench_model(model: str) -> str:
    """`tiny-random` -> a cached tiny checkpoint (made once); anything else as given."""
    if model != TINY_MODEL:
        return model
    from pathlib import Path

    from omnistage.cache import cache_root
    from omnistage.models.tiny_checkpoints import make_checkpoint

    path = Path(cache_root()) / "bench" / TINY_MODEL
    if not (path / "config.json").exists():
        make_checkpoint(path, "llama", seed=0)
    return str(path)


# -- peers (each runs in its own process) ------------------------------------------------------
def run_omnistage(args: argparse.Namespace, spawn_time: float) -> dict[str, Any]:
    from omnistage import SamplingParams
    from omnistage.config import EngineConfig
    from omnistage.engine.llm_engine import LLMEngine

    async_scheduling = {"omnistage-sync": False, "omnistage-async": True}.get(
        args._peer, args.async_scheduling
    )
    engine = LLMEngine(
        EngineConfig(
            model=resolve_bench_model(args.model),
            dtype=args.dtype,
            max_num_seqs=max(args.num_prompts, 1),
            max_num_batched_tokens=args.max_num_batched_tokens,
            num_threads=args.threads,
            async_scheduling=async_scheduling,
            speculative_config=args.speculative_config if args._peer == "omnistage-spec" else None,
        )
    )
    vocab = engine.hf_config.vocab_size
    if args.workload == "repetitive":
        prompts = make_repetitive_workload(engine.tokenizer, args.num_prompts)
    else:
        prompts = make_workload(args.num_prompts, args.input_len, vocab, args.seed)
    engine.add_tokenized_request(
        "warmup",
        None,
        prompts[0][:16],
        SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
    )
    first = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if first is None and out.outputs[0].token_ids:
                first = time.time()
    params = SamplingParams(
        temperature=0, max_tokens=args.output_len, ignore_eos=args.workload == "random"
    )
    stats = engine.core.scheduler.spec_stats
    drafts_before, accepted_before = stats.num_draft_tokens, stats.num_accepted_tokens
    steps_before = stats.num_verifying_steps
    start = time.perf_counter()
    for i, p in enumerate(prompts):
        engine.add_tokenized_request(str(i), None, p, params)
    generated, outputs = 0, []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                generated += len(out.outputs[0].token_ids)
                outputs.append(out.outputs[0].token_ids)
    elapsed = time.perf_counter() - start
    steps = stats.num_verifying_steps - steps_before
    return {
        "elapsed_s": elapsed,
        "output_tokens": generated,
        "startup_to_first_token_s": first - spawn_time,
        "model_path": str(engine.model_files.path),
        "draft_tokens": stats.num_draft_tokens - drafts_before,
        "accepted_tokens": stats.num_accepted_tokens - accepted_before,
        "mean_acceptance_length": 1 + (stats.num_accepted_tokens - accepted_before) / steps
        if steps
        else 0.0,
        "outputs_digest": hash(tuple(map(tuple, sorted(outputs)))),
    }


def run_transformers(args: argparse.Namespace, spawn_time: float) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM
    from transformers.generation.streamers import BaseStreamer

    from omnistage.config import parse_dtype
    from omnistage.models.loader import resolve_model

    if args.threads:
        torch.set_num_threads(args.threads)
    files = resolve_model(resolve_bench_model(args.model))
    model = AutoModelForCausalLM.from_pretrained(files.path, dtype=parse_dtype(args.dtype)).eval()

    class FirstToken(BaseStreamer):
        def __init__(self) -> None:
            self.calls, self.first = 0, None

        def put(self, value: Any) -> None:
            self.calls += 1
            if self.calls == 2 and self.first is None:
                self.first = time.time()

        def end(self) -> None:
            pass

    prompts = make_workload(args.num_prompts, args.input_len, model.config.vocab_size, args.seed)
    streamer = FirstToken()
    with torch.inference_mode():
        model.generate(
            torch.tensor([prompts[0][:16]]),
            max_new_tokens=4,
            min_new_tokens=4,
            do_sample=False,
            streamer=streamer,
            pad_token_id=0,
        )
        ids = torch.tensor(prompts)
        start = time.perf_counter()
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=args.output_len,
            min_new_tokens=args.output_len,
            do_sample=False,
            pad_token_id=0,
        )
        elapsed = time.perf_counter() - start
    generated = int(out.shape[0] * (out.shape[1] - ids.shape[1]))
    return {
        "elapsed_s": elapsed,
        "output_tokens": generated,
        "startup_to_first_token_s": streamer.first - spawn_time,
    }


# -- driver ------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads per peer (default: all cores)"
    )
    parser.add_argument(
        "--peers", default=",".join(PEERS), help="comma-separated: omnistage,transformers"
    )
    parser.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="scheduling mode of the omnistage peer",
    )
    parser.add_argument(
        "--compare-scheduling",
        action="store_true",
        help="run omnistage with sync and with async scheduling instead of vs transformers",
    )
    parser.add_argument(
        "--speculative-config",
        default=None,
        help='JSON, e.g. \'{"method": "ngram", "num_speculative_tokens": 4}\': run our engine '
        "without and with it instead of vs transformers",
    )
    parser.add_argument(
        "--workload",
        choices=WORKLOADS,
        default="random",
        help="random token prompts, or repetitive (return a given document with one edit)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="runs per peer, interleaved; the best is reported (default 1, or 3 with --compare-scheduling)",
    )
    parser.add_argument("--_peer", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_spawn-time", type=float, default=None, help=argparse.SUPPRESS)


def run_peer_subprocess(args: argparse.Namespace, peer: str) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "omnistage.benchmarks.throughput",
        "--_peer",
        peer,
        "--_spawn-time",
        repr(time.time()),
    ]
    for key in (
        "model",
        "dtype",
        "num_prompts",
        "input_len",
        "output_len",
        "seed",
        "max_num_batched_tokens",
        "threads",
        "speculative_config",
        "workload",
    ):
        value = getattr(args, key)
        if value is not None:
            cmd += [f"--{key.replace('_', '-')}", str(value)]
    cmd.append("--async-scheduling" if args.async_scheduling else "--no-async-scheduling")
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env={**os.environ, "TQDM_DISABLE": "1"}
    )
    if proc.returncode != 0:
        raise RuntimeError(f"peer {peer} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(args: argparse.Namespace) -> int:
    if args._peer is not None:
        runner = run_transformers if args._peer == "transformers" else run_omnistage
        print(json.dumps(runner(args, args._spawn_time)))
        return 0
    peers = _peers(args)
    repeat = args.repeat or (3 if args.compare_scheduling else 1)
    results = _best_runs(args, peers, repeat)
    workload = _workload_description(args, repeat)
    _print_table(workload, results)
    summary: dict[str, Any] = {"benchmark": "throughput", "model": args.model, "workload": workload}
    for peer, r in results.items():
        summary[f"{peer}_output_tok_s"] = round(r["output_tokens_per_s"], 2)
        summary[f"{peer}_startup_to_first_token_s"] = round(r["startup_to_first_token_s"], 2)
    summary.update(_ratios(args, results))
    print(json.dumps(summary))
    return 0


def _peers(args: argparse.Namespace) -> list[str]:
    """The peers to run: `--peers`, or the pair `--compare-scheduling` /
    `--speculative-config` compares (a bad speculative config fails here, named)."""
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    if args.compare_scheduling:
        peers = list(SCHEDULING_PEERS)
    if args.speculative_config is not None:
        from omnistage.spec_decode.config import SpeculativeConfig

        SpeculativeConfig.parse(args.speculative_config)  # a bad config fails here, named
        peers = list(SPEC_PEERS)
    unknown = set(peers) - set(PEERS) - set(SCHEDULING_PEERS) - set(SPEC_PEERS)
    if unknown:
        raise ValueError(f"--peers: unknown peer(s) {sorted(unknown)}; known: {', '.join(PEERS)}")
    return peers


def _best_runs(
    args: argparse.Namespace, peers: list[str], repeat: int
) -> dict[str, dict[str, Any]]:
    """Each peer's fastest of `repeat` runs, with its output tokens per second."""
    results: dict[str, dict[str, Any]] = {}
    for _ in range(repeat):  # interleaved, best of `repeat` per peer: this machine is noisy
        for peer in peers:
            run = run_peer_subprocess(args, peer)
            if peer not in results or run["elapsed_s"] < results[peer]["elapsed_s"]:
                results[peer] = run
    for r in results.values():
        r["output_tokens_per_s"] = r["output_tokens"] / r["elapsed_s"]
    return results


def _workload_description(args: argparse.Namespace, repeat: int) -> str:
    if args.workload == "repetitive":
        workload = (
            f"best of {repeat}: {args.num_prompts} chat prompts 'return this module with one edit' "
            f"(a 26-line module), up to {args.output_len} output tokens, greedy, stop at EOS, "
            f"dtype {args.dtype}"
        )
    else:
        workload = (
            f"best of {repeat}: {args.num_prompts} prompts x {args.input_len} random tokens, "
            f"{args.output_len} output tokens each, greedy, ignore_eos, dtype {args.dtype}"
        )
    if not args.compare_scheduling:
        mode = "async" if args.async_scheduling else "sync"
        workload += f", {mode} scheduling"
    return workload


def _print_table(workload: str, results: dict[str, dict[str, Any]]) -> None:
    print(f"workload: {workload}")
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
    )
    print(f"{'peer':<14}{'output tok/s':>14}{'elapsed s':>12}{'start->1st tok s':>18}")
    for peer, r in results.items():
        print(
            f"{peer:<14}{r['output_tokens_per_s']:>14.1f}{r['elapsed_s']:>12.2f}{r['startup_to_first_token_s']:>18.2f}"
        )


def _ratios(args: argparse.Namespace, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Print the comparisons the peers allow; return them for the JSON summary."""
    summary: dict[str, Any] = {}
    if "omnistage" in results and "transformers" in results:
        ratio = (
            results["omnistage"]["output_tokens_per_s"]
            / results["transformers"]["output_tokens_per_s"]
        )
        print(f"omnistage / transformers: {ratio:.2f}x")
        summary["ratio_vs_transformers"] = round(ratio, 3)
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


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
