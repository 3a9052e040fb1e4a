"""`omnistage bench throughput`: our engine against HF transformers and vLLM, same model,
same run (`--peers omnistage,transformers,vllm`; vLLM runs in its own environment, see
`vllm_peer`, on the same prompt token ids).

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
import subprocess
import sys
import time
from typing import Any

import torch

from omnistage.benchmarks import vllm_peer
from omnistage.benchmarks.throughput_report import (
    SCHEDULING_PEERS,
    print_table,
    ratios,
    workload_description,
)
from omnistage.benchmarks.throughput_workloads import (
    WORKLOADS,
    make_repetitive_workload,
    make_workload,
    parse_input_len,
)

PEERS = ("omnistage", "transformers", "vllm")
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
        prompts = make_workload(args.num_prompts, parse_input_len(args.input_len), vocab, args.seed)
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

    lengths = parse_input_len(args.input_len)
    prompts = make_workload(args.num_prompts, lengths, model.config.vocab_size, args.seed)
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
        width = max(map(len, prompts))  # prompts of several lengths: padded on the left
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        start = time.perf_counter()
        out = model.generate(
            ids,
            attention_mask=mask,
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
    parser.add_argument("--input-len", default="128", help="tokens: N, or LOW-HIGH per prompt")
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads per peer (default: all cores)"
    )
    parser.add_argument(
        "--peers", default="omnistage,transformers", help=f"comma-separated: {','.join(PEERS)}"
    )
    parser.add_argument(
        "--vllm-python", default=None, help="--peers vllm: its environment's python"
    )
    parser.add_argument("--vllm-model", default=None, help="--peers vllm: the model as an HF dir")
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
    if peer == "vllm":
        return _run_vllm(args)
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


def _run_vllm(args: argparse.Namespace) -> dict[str, Any]:
    """vLLM on the prompts omnistage gets (same seed, lengths and vocabulary)."""
    with open(os.path.join(args.vllm_model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    prompts = make_workload(args.num_prompts, parse_input_len(args.input_len), vocab, args.seed)
    return vllm_peer.run(
        args.vllm_python,
        args.vllm_model,
        args.dtype,
        args.threads,
        args.seed,
        prompts,
        args.output_len,
    )


def main(args: argparse.Namespace) -> int:
    if args._peer is not None:
        runner = run_transformers if args._peer == "transformers" else run_omnistage
        print(json.dumps(runner(args, args._spawn_time)))
        return 0
    peers = _peers(args)
    repeat = args.repeat or (3 if args.compare_scheduling else 1)
    results = _best_runs(args, peers, repeat)
    workload = workload_description(args, repeat)
    print_table(workload, results)
    summary: dict[str, Any] = {"benchmark": "throughput", "model": args.model, "workload": workload}
    for peer, r in results.items():
        summary[f"{peer}_output_tok_s"] = round(r["output_tokens_per_s"], 2)
        summary[f"{peer}_startup_to_first_token_s"] = round(r["startup_to_first_token_s"], 2)
    summary.update(ratios(args, results))
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
    parse_input_len(args.input_len)
    if "vllm" in peers:
        if args.workload != "random":
            raise ValueError("--peers vllm: only with --workload random")
        for flag, path in (("python", args.vllm_python), ("model", args.vllm_model)):
            if not path or not os.path.exists(path):
                raise ValueError(f"--vllm-{flag}: needed for --peers vllm, got {path!r}")
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


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
