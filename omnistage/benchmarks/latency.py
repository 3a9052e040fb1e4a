"""`omnistage bench latency`: one request's decode speed against llama.cpp, per weight format.

For each GGUF file given (e.g. the peers' f32, Q8_0 and Q4_1 builds of the
built-in model), both engines decode one request of `--tokens` tokens after a
short prompt, greedy, never stopping early:

- `omnistage`: `LLM(model=FILE)` with its defaults (a quantized file keeps its
  format: the quantized kernels; an F32 file runs float32), in a fresh process
  per file. Decode time is the time of a request of `tokens + 1` output tokens
  minus that of a 1-token request (the prefill and the first token), best of
  `--repeat` after a warm-up.
- `llama.cpp`: `llama-bench -m FILE -p 0 -n TOKENS -t THREADS -r REPEAT`
  (its text-generation test: tokens/s of decoding TOKENS tokens), given with
  `--llama-bench` (the peers' build: `../shared/tools/peers.sh`).

Runs alternate file by file, and for each file ours and llama.cpp's alternate
`--rounds` times (this machine's speed drifts by tens of percent over minutes:
a ratio of two runs taken minutes apart says little); the best of each is kept.
Tokens/s and the ratio ours / llama.cpp are printed with the CPU flags, and the
last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from omnistage.benchmarks.startup import cpu_flags

PROMPT = "Once upon a time"
TARGET_RATIO = 1.2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gguf", required=True, help="comma-separated GGUF files")
    parser.add_argument("--llama-bench", default=None, help="llama.cpp's llama-bench binary")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="alternations ours / llama.cpp")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True)


def ours(path: str, tokens: int, repeat: int, async_scheduling: bool) -> dict[str, Any]:
    """Runs in its own process (`python -m omnistage.benchmarks.latency --ours ...`)."""
    from omnistage import LLM, SamplingParams

    llm = LLM(model=path, async_scheduling=async_scheduling, max_model_len=tokens + 64)

    def timed(n: int) -> float:
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        start = time.perf_counter()
        out = llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]
        if len(out.token_ids) != n:
            raise RuntimeError(f"asked for {n} tokens, got {len(out.token_ids)}")
        return time.perf_counter() - start

    timed(16)  # warm-up: kernels, caches
    best = min(timed(tokens + 1) - timed(1) for _ in range(repeat))
    return {"tokens_per_s": tokens / best}


def _ours_in_child(path: str, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, "-m", "omnistage.benchmarks.latency", "--ours", path]
    command += ["--tokens", str(args.tokens), "--repeat", str(args.repeat)]
    command += ["--async-scheduling" if args.async_scheduling else "--no-async-scheduling"]
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"omnistage run on {path} failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def _llama_bench(binary: str, path: str, args: argparse.Namespace) -> float:
    command = [binary, "-m", path, "-p", "0", "-n", str(args.tokens)]
    command += ["-t", str(args.threads), "-r", str(args.repeat), "-o", "json"]
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise RuntimeError(f"llama-bench on {path} failed:\n{proc.stderr[-3000:]}")
    rows = json.loads(proc.stdout)
    return float(next(r for r in rows if r["n_gen"] == args.tokens)["avg_ts"])


def _format(path: str) -> str:
    import gguf

    reader = gguf.GGUFReader(path)
    kinds = [t.tensor_type.name for t in reader.tensors if len(t.shape) == 2]
    return max(set(kinds), key=kinds.count)


def main(args: argparse.Namespace) -> int:
    rows = []
    for path in args.gguf.split(","):
        row: dict[str, Any] = {"file": Path(path).name, "format": _format(path)}
        for _ in range(max(1, args.rounds)):
            ours_tok_s = round(_ours_in_child(path, args)["tokens_per_s"], 2)
            row["omnistage_tok_s"] = max(row.get("omnistage_tok_s", 0.0), ours_tok_s)
            if args.llama_bench:
                peer_tok_s = round(_llama_bench(args.llama_bench, path, args), 2)
                row["llamacpp_tok_s"] = max(row.get("llamacpp_tok_s", 0.0), peer_tok_s)
        if args.llama_bench:
            row["ratio"] = round(row["omnistage_tok_s"] / row["llamacpp_tok_s"], 3)
        rows.append(row)
        print(
            f"{row['file']:<28} {row['format']:<6} omnistage {row['omnistage_tok_s']:8.1f} tok/s"
            + (
                f"   llama.cpp {row['llamacpp_tok_s']:8.1f} tok/s   ratio {row['ratio']:.2f}x"
                if "ratio" in row
                else ""
            ),
            flush=True,
        )
    workload = (
        f"one request, prompt {PROMPT!r}, {args.tokens} greedy tokens decoded (ignore_eos), "
        f"best of {args.repeat} runs in each of {args.rounds} alternating rounds; llama-bench -p 0 -n {args.tokens} -t {args.threads}; "
        f"omnistage {'async' if args.async_scheduling else 'sync'} scheduling, defaults"
    )
    summary = {
        "benchmark": "latency",
        "workload": workload,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "cpu_flags": cpu_flags(),
        "results": rows,
        "target_ratio": TARGET_RATIO,
        "target_met": all(r.get("ratio", 0) >= TARGET_RATIO for r in rows),
    }
    print(json.dumps(summary))
    return 0


def _child_main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ours", required=True)
    parser.add_argument("--tokens", type=int, required=True)
    parser.add_argument("--repeat", type=int, required=True)
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction)
    a = parser.parse_args()
    result = ours(a.ours, a.tokens, a.repeat, a.async_scheduling)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(_child_main())
