"""`omnistage bench image`: images out on the built-in `demo-image` (think -> recaption -> draw).

Workload (seeded): `--concurrency` distinct chat prompts of 4-8 random lowercase
words, submitted at once through `AsyncOmni` to the packaged demo-image
pipeline (a process per stage, random weights made locally once; nothing is
downloaded). The thinker (tiny llama, temperature 1, seeded) writes a 24-token
thought and a 32-token caption (its section budgets); the draw stage (T5 text
encoder, PixArt DiT with 4x4 patches, VAE, flow-matching Euler; 2 torch threads)
draws each caption at
`--size` x `--size` pixels in `--steps` steps with guidance 4 (a conditional and
an unconditional row per image and step).

Two modes, the same requests, interleaved repeats (the best images/s kept):

- `batched`: the draw stage batches up to 8 requests per denoising step (its
  default, step-level continuous batching);
- `one at a time`: the draw stage runs one request at a time (`max_num_seqs: 1`),
  which is how a diffusers pipeline call serves requests: the same components,
  one image per loop.

Reported: images per second (requests / wall time), and per request the
latency split by stage: `think` (submit -> the thinker's caption is done),
`draw` (-> the image arrives), `e2e` (medians). A table, then one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import statistics
import time
from typing import Any

import torch

from omnistage.benchmarks.pipeline import make_prompts

MODES = {"batched": 8, "one at a time": 1}
TARGET = 2.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--size", type=int, default=64, help="image height and width")
    parser.add_argument("--steps", type=int, default=50, help="denoising steps (diffusers' usual)")
    parser.add_argument("--repeat", type=int, default=2, help="interleaved runs; best reported")
    parser.add_argument("--seed", type=int, default=0)


def _chat(words: str) -> str:
    return f"<|im_start|>user\n{words}<|im_end|>\n<|im_start|>assistant\n<think>"


def _deploy(max_batch: int) -> Any:
    from omnistage.pipeline.deploy import deploy_for_model

    spec = deploy_for_model("demo-image")
    stages = tuple(
        dataclasses.replace(s, engine_args=s.engine_args | {"max_num_seqs": max_batch})
        if s.kind == "diffusion"
        else s
        for s in spec.stages
    )
    return dataclasses.replace(spec, stages=stages)


async def _serve(omni: Any, prompts: list[str], params: Any) -> dict[str, float]:
    async def one(prompt: str) -> tuple[float, float]:
        submitted, thought = time.perf_counter(), None
        async for out in omni.generate(prompt, params):
            if out.error is not None:
                raise RuntimeError(f"request {out.request_id} failed: {out.error}")
            thinker = out.outputs.get("thinker")
            if thought is None and (out.finished or (thinker is not None and thinker.finished)):
                thought = time.perf_counter() - submitted
            if out.finished and out.image_array is None:
                raise RuntimeError(f"request {out.request_id} finished without an image")
        return thought, time.perf_counter() - submitted

    start = time.perf_counter()
    results = await asyncio.gather(*(one(p) for p in prompts))
    wall = time.perf_counter() - start
    return {
        "images_per_s": len(prompts) / wall,
        "think_median_s": statistics.median(r[0] for r in results),
        "draw_median_s": statistics.median(r[1] - r[0] for r in results),
        "e2e_median_s": statistics.median(r[1] for r in results),
        "wall_s": wall,
    }


def run_mode(args: argparse.Namespace, max_batch: int, tag: str) -> dict[str, float]:
    from omnistage.diffusion.params import DiffusionParams
    from omnistage.pipeline.omni import AsyncOmni

    params = DiffusionParams(height=args.size, width=args.size, num_inference_steps=args.steps)
    prompts = [_chat(f"{tag} {p}") for p in make_prompts(args.concurrency, args.seed)]
    with AsyncOmni(_deploy(max_batch)) as omni:
        asyncio.run(_serve(omni, [_chat("warm up")], params))
        return asyncio.run(_serve(omni, prompts, params))


def main(args: argparse.Namespace) -> int:
    for name in ("concurrency", "steps", "repeat"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name}: must be at least 1")
    best: dict[str, dict[str, float]] = {}
    for i in range(args.repeat):
        for mode in list(MODES)[:: -1 if i % 2 else 1]:
            r = run_mode(args, MODES[mode], f"run{i}")
            if mode not in best or r["images_per_s"] > best[mode]["images_per_s"]:
                best[mode] = r
    workload = (
        f"best of {args.repeat} (highest images/s): demo-image (tiny random-weight llama "
        f"thinker, T5 + PixArt DiT + VAE, float32), {args.concurrency} concurrent chat prompts "
        "of 4-8 random words, thinker 24-token thought + 32-token caption (temperature 1, "
        f"seeded), {args.size}x{args.size} images, {args.steps} flow-matching steps, guidance 4, "
        "a process per stage (draw: 2 torch threads); batched: up to 8 requests per "
        "denoising step; one at a time: "
        "max_num_seqs 1 (a diffusers pipeline call per image)"
    )
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
    print(f"workload: {workload}\nmachine: {machine}")
    print(f"{'mode':<15}{'images/s':>10}{'think s':>9}{'draw s':>9}{'e2e s':>9}")
    for mode, r in best.items():
        print(
            f"{mode:<15}{r['images_per_s']:>10.2f}{r['think_median_s']:>9.3f}"
            f"{r['draw_median_s']:>9.3f}{r['e2e_median_s']:>9.3f}"
        )
    ratio = best["batched"]["images_per_s"] / best["one at a time"]["images_per_s"]
    print(f"images/s batched / one at a time: {ratio:.2f}x (target >= {TARGET}x)")
    summary: dict[str, Any] = {"benchmark": "image", "workload": workload, "machine": machine}
    for mode, r in best.items():
        key = mode.replace(" ", "_")
        summary |= {f"{key}_{k}": round(v, 4) for k, v in r.items()}
    summary |= {"ratio_images_per_s_batched_vs_one": round(ratio, 3), "target_met": ratio >= TARGET}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
