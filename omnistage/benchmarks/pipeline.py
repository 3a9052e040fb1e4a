"""`omnistage bench pipeline`: the tiny three-stage pipeline, overlapped vs sequential.

Workload (seeded): `--concurrency` distinct prompts of 4-8 random lowercase
words through the tiny thinker → talker → vocoder pipeline (`make_tiny_omni`,
random weights, made locally once under `cache_root()/bench/tiny-omni`). The
thinker writes `--thinker-tokens` and the talker `--talker-tokens` codes per
request (greedy, ignore_eos, sync scheduling); the vocoder turns codes into
audio. Nothing is downloaded.

1. Throughput (requests/s):
   - overlapped: a process per stage (`Omni(deploy)`, every edge streamed), every
     request submitted at once: stages overlap across processes and batch;
   - sequential: the same pipeline, one request at a time, each finished
     before the next is sent (the stages run one after another per request);
   - in-process: every stage in this process (`in_process=True`), every
     request at once: batching, but no overlap across processes.
2. Time to first output of the last stage (TTFO): `AsyncOmni` with a process
   per stage, every request submitted at once; per request, the time from its
   submit to the first update that brings vocoder audio. `stream`: every edge
   streamed — the talker starts from the thinker's first chunk and each later
   thinker hidden state conditions one talker step; the vocoder gets codes in
   chunks of 2, then 8, with 4 frames of left context — vs `payload`: every
   edge carries a whole payload when its producer has finished.

Each pipeline's start-up is timed apart and excluded; each serves one warm-up
request before it is timed. Repeats are interleaved and the best of each
measurement is reported (for TTFO: the run with the lowest median). A table,
then one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import statistics
import string
import time
from pathlib import Path
from typing import Any

import torch

LAST_STAGE = "vocoder"
STREAM = {"chunk_size": 8, "first_chunk_size": 2, "left_context": 4}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--concurrency", type=int, default=32, help="requests per measurement")
    parser.add_argument("--thinker-tokens", type=int, default=32)
    # Speech codecs emit several frames per text token (Qwen3-Omni's talker: 12.5 frames/s
    # for ~3-4 text tokens/s of speech), so the talker writes ~4x the thinker's tokens.
    parser.add_argument("--talker-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=2, help="interleaved runs; best reported")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--seed", type=int, default=0)


def make_prompts(n: int, seed: int) -> list[str]:
    """`n` distinct prompts of 4-8 random lowercase words."""
    rng, prompts = random.Random(seed), dict[str, None]()
    while len(prompts) < n:
        words = (
            "".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 8)))
            for _ in range(rng.randint(4, 8))
        )
        prompts[" ".join(words)] = None
    return list(prompts)


def tagged(prompts: list[str], tag: str) -> list[str]:
    """The prompts behind a per-measurement tag, so no measurement is served from another's
    prefix-cache blocks (a prefix-cache hit also fails a stage that passes hidden states on)."""
    return [f"{tag} {p}" for p in prompts]


def make_deploy(args: argparse.Namespace, transfer: str) -> dict[str, Any]:
    from omnistage.cache import cache_root
    from omnistage.testing.tiny_pipeline import make_tiny_omni, tiny_pipeline_deploy

    return tiny_pipeline_deploy(
        make_tiny_omni(Path(cache_root()) / "bench" / "tiny-omni"),
        transfer=transfer,
        thinker_transfer=transfer,
        dtype=args.dtype,
        thinker_tokens=args.thinker_tokens,
        talker_tokens=args.talker_tokens,
        max_num_seqs=max(64, args.concurrency),
        **(STREAM if transfer == "stream" else {}),
    )


def check(outputs: list[Any], args: argparse.Namespace) -> None:
    """Every request did the full work: no error, all thinker tokens, some audio."""
    for out in outputs:
        if out.error is not None or len(out.token_ids) != args.thinker_tokens or out.audio is None:
            raise RuntimeError(f"request {out.request_id} failed: {out.error}")


def run_throughput(args: argparse.Namespace, prompts: list[str], flip: bool) -> dict[str, float]:
    """Start-up and requests/s of the process-per-stage pipeline (overlapped and sequential,
    order flipped on alternate repeats) and of the in-process pipeline."""
    from omnistage.pipeline.omni import Omni

    def overlapped(omni: Omni, tag: str = "ovl") -> float:
        start = time.perf_counter()
        check(omni.generate(tagged(prompts, tag)), args)
        return len(prompts) / (time.perf_counter() - start)

    def sequential(omni: Omni) -> float:
        start = time.perf_counter()
        for prompt in tagged(prompts, "seq"):
            check(omni.generate(prompt), args)
        return len(prompts) / (time.perf_counter() - start)

    result: dict[str, float] = {}
    for in_process in (False, True):
        start = time.perf_counter()
        with Omni(make_deploy(args, "stream"), in_process=in_process) as omni:
            result["startup_in_process_s" if in_process else "startup_s"] = (
                time.perf_counter() - start
            )
            check(omni.generate(["warm up the pipeline"]), args)
            if in_process:
                result["in_process"] = overlapped(omni, "inp")
            else:
                for name in ("sequential", "overlapped")[:: -1 if flip else 1]:
                    result[name] = (overlapped if name == "overlapped" else sequential)(omni)
    return result


async def _first_audio_times(omni: Any, prompts: list[str]) -> list[float]:
    async def one(prompt: str) -> float:
        submitted, first = time.perf_counter(), None
        async for out in omni.generate(prompt):
            if out.error is not None:
                raise RuntimeError(f"request {out.request_id} failed: {out.error}")
            if first is None and out.stage == LAST_STAGE and out.new_data is not None:
                first = time.perf_counter() - submitted
        if first is None:
            raise RuntimeError("a request finished without audio")
        return first

    return list(await asyncio.gather(*(one(p) for p in prompts)))


def run_ttfo(args: argparse.Namespace, prompts: list[str], transfer: str) -> dict[str, float]:
    from omnistage.pipeline.omni import AsyncOmni

    with AsyncOmni(make_deploy(args, transfer)) as omni:
        asyncio.run(_first_audio_times(omni, ["warm up the pipeline"]))
        start = time.perf_counter()
        times = sorted(asyncio.run(_first_audio_times(omni, tagged(prompts, transfer[:3]))))
        elapsed = time.perf_counter() - start
    p90 = times[math.ceil(0.9 * len(times)) - 1]  # nearest rank
    return {"median": statistics.median(times), "p90": p90, "all_done_s": elapsed}


def measure(args: argparse.Namespace) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Interleaved repeats; best of each: highest req/s, lowest start-up, lowest TTFO median."""
    prompts = make_prompts(args.concurrency, args.seed)
    best: dict[str, float] = {}
    ttfo: dict[str, dict[str, float]] = {}
    for i in range(args.repeat):
        for key, value in run_throughput(args, prompts, flip=i % 2 == 1).items():
            better = min if key.startswith("startup") else max
            best[key] = better(best.get(key, value), value)
        for transfer in ("stream", "payload")[:: -1 if i % 2 else 1]:
            run = run_ttfo(args, prompts, transfer)
            if transfer not in ttfo or run["median"] < ttfo[transfer]["median"]:
                ttfo[transfer] = run
    return best, ttfo


def main(args: argparse.Namespace) -> int:
    for name in ("concurrency", "thinker_tokens", "talker_tokens", "repeat"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}: must be at least 1")
    tp, ttfo = measure(args)
    workload = (
        f"best of {args.repeat}: {args.concurrency} concurrent requests (seeded random words), "
        f"thinker {args.thinker_tokens} + talker {args.talker_tokens} tokens each, greedy, "
        f"ignore_eos, sync scheduling, dtype {args.dtype}, tiny thinker/talker/vocoder; "
        f"stream chunks {STREAM['first_chunk_size']} then {STREAM['chunk_size']}, "
        f"left context {STREAM['left_context']}"
    )
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
    ratio_seq = tp["overlapped"] / tp["sequential"]
    ratio_inp = tp["overlapped"] / tp["in_process"]
    ratio_ttfo = ttfo["stream"]["median"] / ttfo["payload"]["median"]
    print(f"workload: {workload}\nmachine: {machine}")
    print(
        f"start-up: process per stage {tp['startup_s']:.2f} s, in-process {tp['startup_in_process_s']:.2f} s (excluded)"
    )
    print(f"{'throughput':<34}{'req/s':>10}")
    for name, label in (
        ("overlapped", "overlapped (process per stage)"),
        ("sequential", "sequential (one request at a time)"),
        ("in_process", "in-process (all at once)"),
    ):
        print(f"{label:<34}{tp[name]:>10.2f}")
    print(f"overlapped / sequential: {ratio_seq:.2f}x (target >= 1.5x)")
    print(f"overlapped / in-process: {ratio_inp:.2f}x")
    print(f"{'first audio (TTFO)':<20}{'median s':>10}{'p90 s':>10}{'all done s':>12}")
    for mode in ("stream", "payload"):
        r = ttfo[mode]
        print(f"{mode:<20}{r['median']:>10.3f}{r['p90']:>10.3f}{r['all_done_s']:>12.2f}")
    print(f"stream / payload median TTFO: {ratio_ttfo:.2f} (target <= 0.33)")
    summary = {
        "benchmark": "pipeline",
        "workload": workload,
        "machine": machine,
        "overlapped_req_s": round(tp["overlapped"], 3),
        "sequential_req_s": round(tp["sequential"], 3),
        "in_process_req_s": round(tp["in_process"], 3),
        "ratio_overlapped_vs_sequential": round(ratio_seq, 3),
        "ratio_overlapped_vs_in_process": round(ratio_inp, 3),
        "startup_process_per_stage_s": round(tp["startup_s"], 2),
        "startup_in_process_s": round(tp["startup_in_process_s"], 2),
        "ttfo_stream_median_s": round(ttfo["stream"]["median"], 4),
        "ttfo_stream_p90_s": round(ttfo["stream"]["p90"], 4),
        "ttfo_payload_median_s": round(ttfo["payload"]["median"], 4),
        "ttfo_payload_p90_s": round(ttfo["payload"]["p90"], 4),
        "ratio_ttfo_stream_vs_payload": round(ratio_ttfo, 3),
        "target_overlap_met": ratio_seq >= 1.5,
        "target_ttfo_met": ratio_ttfo <= 1 / 3,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
