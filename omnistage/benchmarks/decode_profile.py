"""`python -m omnistage.benchmarks.decode_profile MODEL`: where a decode program's time goes,
op by op, inside a real generation.

Builds the kernels with the decode program's per-op clock (`OMNISTAGE_PROFILE_DECODE_PROGRAM`,
`-DPROGRAM_PROFILE`), generates `--tokens` greedy tokens of one request with synchronous
scheduling (prefix caching off) after a warm-up request, and prints per kind of op (a
product by its shape and epilogue): how many a step runs, the calling thread's time in
them, its wait at the barrier after them (the other threads' share still running), a
worker's time, per step and per op; then the step's own time split into the program, the
LM head and the rest (scheduler, inputs, sampling, detokenizing). Op 0 of every
`pool_matmul` call (the LM head) is op 0 of its own one-op program and is left out of the
table. One JSON line at the end.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import time

import numpy as np

from omnistage import kernels

KINDS = {1: "rms_norm", 2: "matmul", 3: "rope_kv", 4: "attention", 5: "qk_norm"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--quant-activations", default=None, choices=["int8", "float32"])
    args = parser.parse_args()
    os.environ[kernels.PROFILE_ENV] = "1"
    from omnistage import LLM, SamplingParams
    from omnistage.layers import decode_program

    llm = LLM(
        model=args.model,
        async_scheduling=False,
        enable_prefix_caching=False,
        quant_activations=args.quant_activations,
    )
    spent = {"program": 0.0, "lm_head": 0.0}
    run = decode_program.DecodeProgram.run

    def timed_run(self, *a):
        start = time.perf_counter()
        try:
            return run(self, *a)
        finally:
            spent["program"] += time.perf_counter() - start

    model = llm.engine.core.executor.runner.model
    logits = type(model).compute_logits

    def timed_logits(self, hidden):
        start = time.perf_counter()
        try:
            return logits(self, hidden)
        finally:
            spent["lm_head"] += time.perf_counter() - start

    decode_program.DecodeProgram.run = timed_run
    type(model).compute_logits = timed_logits
    params = SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True)
    llm.generate(["Once upon a time"], params, use_tqdm=False)
    clock = np.ctypeslib.as_array(kernels.load().decode_program_profile(), shape=(4096, 3))
    clock[:] = 0
    spent.update(program=0.0, lm_head=0.0)
    start = time.perf_counter()
    llm.generate(["Once upon a time"], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    program = next(m._program for m in model.modules() if getattr(m, "_program", None))
    steps = args.tokens - 1  # the first token comes from the prefill
    ops = program._ops
    rows: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for i in range(1, len(ops)):
        op = ops[i]
        key = KINDS[op.kind]
        if op.kind == 2:
            key += f" {op.depth}->{op.width} epilogue {op.epilogue}"
        row = rows[key]
        row[0] += 1
        for j in range(3):
            row[1 + j] += clock[i, j] / steps / 1e3
    print(f"{'op':<34} {'count':>5} {'work us':>9} {'wait us':>9} {'worker us':>9} {'per op':>8}")
    for key, (count, work, wait, worker) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
        print(f"{key:<34} {count:5d} {work:9.1f} {wait:9.1f} {worker:9.1f} {work / count:8.2f}")
    step_ms = 1e3 * elapsed / steps
    split = {k: round(1e3 * v / steps, 3) for k, v in spent.items()}
    split["rest"] = round(step_ms - split["program"] - split["lm_head"], 3)
    print(f"step {step_ms:.2f} ms: " + ", ".join(f"{k} {v:.2f} ms" for k, v in split.items()))
    summary = {
        "benchmark": "decode_profile",
        "model": args.model,
        "tokens": args.tokens,
        "step_ms": round(step_ms, 3),
        "split_ms": split,
        "ops_us_per_step": {k: [round(v, 1) for v in r[1:]] for k, r in rows.items()},
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
