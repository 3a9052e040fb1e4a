"""Time to first audio of MiMo-Audio's streaming code2wav against whole segments, on the
built-in `demo-mimo-audio` (tiny random weights, made locally once; nothing downloaded):

    python -m omnistage.benchmarks.mimo_audio_stream [--steps 200] [--concurrency 1,4]

Workload (seeded): chat prompts of random words, the LM sampled as the deploy's default
(temperature 0.6, top-p 1.0) with a seed per request and `ignore_eos`, `--steps` LM
positions each; both modes get the same LM output (same seeds), so the same codes.

- `whole` (the packaged `demo-mimo-audio`: stream chunks of 375 steps, each decoded as an
  independent segment as the reference `MimoAudio` decodes 1500 codes): with fewer steps
  than 375 the audio comes at the end;
- `stream` (`demo-mimo-audio-stream`: chunks of 16, then 25 steps, each decoded as the
  tokenizer's `streaming_decode`).

A process per stage (`AsyncOmni`), all requests of a level submitted at once, a warm-up
request first; interleaved repeats, the lowest median TTFA kept. Reported per mode and
level: median time to first audio (submit -> first update bringing samples), median time
to the last, and the CPU. A table, then one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from typing import Any

import torch

from omnistage.benchmarks.pipeline import make_prompts
from omnistage.benchmarks.startup import cpu_flags

MODES = {"whole": "demo-mimo-audio", "stream": "demo-mimo-audio-stream"}


def deploy(mode: str) -> Any:
    from omnistage.pipeline.deploy import deploy_for_model, load_deploy, packaged_deploy_path

    model = deploy_for_model("demo-mimo-audio").stages[0].model
    return load_deploy(packaged_deploy_path(MODES[mode])).with_model(model)


async def _serve(omni: Any, prompts: list[str], steps: int) -> dict[str, float]:
    from omnistage import SamplingParams

    async def one(i: int, words: str) -> tuple[float, float, int]:
        params = {"lm": SamplingParams(temperature=0.6, top_p=1.0, seed=i, max_tokens=steps,
                                       ignore_eos=True)}  # fmt: skip
        prompt = {"messages": [{"role": "user", "content": words}]}
        submitted, first, samples = time.perf_counter(), None, 0
        async for out in omni.generate(prompt, params):
            if out.error is not None:
                raise RuntimeError(f"request {out.request_id} failed: {out.error}")
            if out.stage == "code2wav" and out.new_data is not None and out.new_data.numel():
                first = first or time.perf_counter() - submitted
                samples += out.new_data.numel()
        if first is None:
            raise RuntimeError("a request finished without audio")
        return first, time.perf_counter() - submitted, samples

    results = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    return {
        "ttfa_median_s": statistics.median(r[0] for r in results),
        "last_median_s": statistics.median(r[1] for r in results),
        "samples": sum(r[2] for r in results),
    }


def run_mode(mode: str, levels: list[int], steps: int, seed: int) -> dict[int, dict]:
    from omnistage.pipeline.omni import AsyncOmni

    with AsyncOmni(deploy(mode)) as omni:
        asyncio.run(_serve(omni, ["warm up"], steps))
        return {n: asyncio.run(_serve(omni, make_prompts(n, seed + n), steps)) for n in levels}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="LM positions per request")
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    best: dict[str, dict[int, dict]] = {}
    for i in range(args.repeat):
        for mode in list(MODES)[:: -1 if i % 2 else 1]:
            for n, r in run_mode(mode, levels, args.steps, args.seed).items():
                kept = best.setdefault(mode, {}).get(n)
                if kept is None or r["ttfa_median_s"] < kept["ttfa_median_s"]:
                    best[mode][n] = r
    machine = {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "flags": cpu_flags(),
        "torch": torch.__version__,
    }
    print(f"{args.steps} LM steps a request, best of {args.repeat}; {machine}")
    print(f"{'mode':<8}{'requests':>9}{'first audio s':>15}{'last audio s':>14}{'samples':>9}")
    for mode, by_level in best.items():
        for n, r in by_level.items():
            print(
                f"{mode:<8}{n:>9}{r['ttfa_median_s']:>15.3f}"
                f"{r['last_median_s']:>14.3f}{r['samples']:>9}"
            )
    print(json.dumps({"steps": args.steps, "machine": machine, "results": best}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
