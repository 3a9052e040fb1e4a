"""`omnistage bench tts`: text to speech on a built-in demo (`--model`: `demo-qwen3-tts`,
the default, or `demo-cosyvoice3`; tiny random weights made locally once; nothing is
downloaded).

Workload (seeded): distinct texts of 4-8 random lowercase words. `demo-qwen3-tts`: the
talker writes `--frames` frames (greedy, ignore_eos; 125 frames = 10 s of audio at 12.5
frames/s), the speaker is the checkpoint's first, code2wav decodes 24 kHz audio (48
samples per frame in the tiny model, 1920 in the real one). `demo-cosyvoice3`: the LM
samples with the deploy's defaults (seeded) and its own budget (the prompter's: up to 20
speech tokens per text token; it replaces the request's `max_tokens`, so `--frames` does
not bound it), token2wav speaks 24 kHz audio. Per concurrency (`--concurrency`,
default 1, 4, 16) and mode, all requests of a measurement are submitted at once
through `AsyncOmni` (a process per stage):

- `stream` (the packaged deploy): codes stream talker -> code2wav in chunks (first 4
  frames, then 16, 32, 64, 64, ...: each frame decoded once, continuing the stream's
  decoder state), so audio starts early;
- `payload`: code2wav gets the whole utterance when the talker has finished.

Reported: time to first audio (TTFA: submit -> first audio; median), real-time factor
(end-to-end time / audio duration; median; lower is better) and audio seconds per
wall second (all requests). The peer, measured in the same run where its venv exists
(`--peer-python` or `--reference-python`; default per model, see below): for
`demo-qwen3-tts` the official `qwen-tts` 0.1.1 on the same checkpoint
(`qwen_tts_peer.py`; `.reference/qwen-tts-env/bin/python`, made by
`tests/fixtures/qwen3_tts/make_reference_env.sh`), one request at a time (its RTF at
c=1) and one batch of 16 (its aggregate audio s/s at c=16); for `demo-cosyvoice3`
FunAudioLLM/CosyVoice's own `tts` on the same checkpoint (`cosyvoice3_peer.py`;
`.reference/cosyvoice-env/bin/python`, made by
`tests/fixtures/cosyvoice3/make_reference_env.sh`), our c=1 texts one at a time,
streamed and whole, with the speech tokens of each side (`tts_cosyvoice3.py`). Repeats
are interleaved and the lowest median TTFA kept. A table, then one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from omnistage.benchmarks import tts_cosyvoice3
from omnistage.benchmarks.pipeline import make_prompts
from omnistage.benchmarks.speech_runs import (
    Results,
    best_by_first_audio,
    flat_fields,
    speech_deploy,
)
from omnistage.benchmarks.startup import cpu_flags

DEMO = "demo-qwen3-tts"
SAMPLE_RATE = 24000
FRAME_RATE = 12.5
DEFAULT_REFERENCE = Path(".reference/qwen-tts-env/bin/python")
COSYVOICE3 = "demo-cosyvoice3"
PEER_PYTHON = {DEMO: DEFAULT_REFERENCE, COSYVOICE3: tts_cosyvoice3.DEFAULT_PYTHON}
"""Each demo's reference venv (its peer is skipped where it does not exist)."""
STAGES = {DEMO: ("talker", "code2wav"), COSYVOICE3: ("llm", "token2wav")}
"""The demos measured: (the stage that writes codes, the stage that speaks)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEMO, choices=sorted(STAGES), help="the demo")
    parser.add_argument("--concurrency", default="1,4,16", help="comma-separated levels")
    parser.add_argument("--frames", type=int, default=125, help="talker frames per request")
    parser.add_argument("--repeat", type=int, default=2, help="interleaved runs; best reported")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--peer-python",
        "--reference-python",
        dest="reference_python",
        default=None,
        help="python of the peer's venv (qwen-tts 0.1.1, or the CosyVoice reference); "
        "default: the model's .reference/ venv; skipped if absent",
    )


async def _serve(omni: Any, texts: list[str], args: argparse.Namespace) -> dict[str, float]:
    from omnistage import SamplingParams

    first_stage, last_stage = STAGES[args.model]
    if args.model == DEMO:
        one_params = SamplingParams(temperature=0, max_tokens=args.frames, ignore_eos=True)
    else:  # the deploy's sampling, seeded per text
        one_params = SamplingParams(temperature=1.0, top_k=25, top_p=0.8, seed=args.seed)
    params = {first_stage: one_params}

    async def one(text: str) -> tuple[float, float, float]:
        submitted, first, samples = time.perf_counter(), None, 0
        async for out in omni.generate(text, params):
            if out.error is not None:
                raise RuntimeError(f"request {out.request_id} failed: {out.error}")
            if out.stage == last_stage and out.new_data is not None and out.new_data.numel():
                first = first or time.perf_counter() - submitted
                samples += out.new_data.numel()
        if first is None:
            raise RuntimeError("a request finished without audio")
        return first, time.perf_counter() - submitted, samples / SAMPLE_RATE

    start = time.perf_counter()
    results = await asyncio.gather(*(one(t) for t in texts))
    wall = time.perf_counter() - start
    return {
        "ttfa_median_s": statistics.median(r[0] for r in results),
        "rtf_median": statistics.median(r[1] / r[2] for r in results),
        "audio_s_per_s": sum(r[2] for r in results) / wall,
        "audio_s_per_request": statistics.mean(r[2] for r in results),
        "wall_s": wall,
    }


def run_mode(args: argparse.Namespace, transfer: str, levels: list[int], tag: str) -> dict:
    from omnistage.pipeline.omni import AsyncOmni

    out = {}
    with AsyncOmni(speech_deploy(args.model, transfer)) as omni:
        asyncio.run(_serve(omni, ["warm up"], args))
        for level in levels:
            texts = [f"{tag} {p}" for p in make_prompts(level, args.seed + level)]
            out[level] = asyncio.run(_serve(omni, texts, args))
    return out


def peer_python(args: argparse.Namespace) -> Path:
    return Path(args.reference_python or PEER_PYTHON[args.model])


def run_reference(args: argparse.Namespace, n: int, batch: int) -> dict[str, float] | None:
    """The official qwen-tts on the same checkpoint, in its own venv; None without one."""
    python = peer_python(args)
    if args.model != DEMO or not python.exists():
        return None
    from omnistage.models.builtin import demo_model_path

    texts = [f"ref {p}" for p in make_prompts(n, args.seed + 1000 + batch)]
    script = Path(__file__).with_name("qwen_tts_peer.py")
    command = [str(python), str(script), str(demo_model_path(DEMO)), json.dumps(texts)]
    done = subprocess.run(
        [*command, str(args.frames), str(batch)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"the reference peer failed:\n{done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # One at a time, requests of equal length: the wall time per audio second is each
    # request's real-time factor.
    result["rtf"] = result["wall_s"] / result["audio_s"]
    result["audio_s_per_s"] = result["audio_s"] / result["wall_s"]
    return result


def run_cosyvoice3_peer(args: argparse.Namespace, levels: list[int]) -> dict | None:
    """The CosyVoice reference on the same checkpoint and our c=1 texts, streamed and
    whole (our mode -> its `summarize`d run); None without its venv or a c=1 level."""
    python = peer_python(args)
    if args.model != COSYVOICE3 or 1 not in levels or not python.exists():
        return None
    from omnistage.models.builtin import demo_model_path

    texts = tts_cosyvoice3.peer_texts(make_prompts(1, args.seed + 1), args.repeat)
    peers = {}
    for mode, peer_mode in tts_cosyvoice3.PEER_MODES.items():
        cmd = tts_cosyvoice3.command(
            python, demo_model_path(COSYVOICE3), texts, args.seed, peer_mode
        )
        peers[mode] = tts_cosyvoice3.summarize(tts_cosyvoice3.run_peer(cmd))
    return peers


def _workload(args: argparse.Namespace) -> str:
    setup = (
        "texts of 4-8 random words, a process per stage, async scheduling; stream: chunks "
        "as the deploy streams them; payload: the whole utterance"
    )
    if args.model != DEMO:
        return (
            f"best of {args.repeat} (lowest median TTFA): {args.model} (tiny random weights, "
            f"float32), LM sampled (deploy defaults, seed {args.seed}) up to its own budget, "
            f"{setup}; reference: FunAudioLLM/CosyVoice tts (ras_sampling to the same "
            "budget, zero-shot, the same voice), our c=1 texts one at a time, streamed "
            "(chunks of 25, 50, then 100 tokens) and whole"
        )
    return (
        f"best of {args.repeat} (lowest median TTFA): {DEMO} (tiny random-weight Qwen3-TTS "
        f"CustomVoice, float32), talker {args.frames} frames ({args.frames / FRAME_RATE:.1f} "
        "s of audio at the real model's 1920 samples per frame; the tiny decoder writes 48, "
        f"and RTF counts those), greedy, ignore_eos, {setup} (talker->code2wav "
        f"{_stream_chunks(DEMO)}); reference: qwen-tts 0.1.1 generate + decode, one request "
        "at a time and one batch of 16"
    )


def _stream_chunks(model: str) -> str:
    """How the packaged deploy's stream edge cuts an utterance, in words."""
    edge = speech_deploy(model, "stream").edges[-1]
    sizes = f"{edge.first_chunk_size} then {edge.chunk_size} frames"
    if edge.chunk_growth > 1:
        cap = "" if edge.max_chunk_size is None else f" up to {edge.max_chunk_size}"
        sizes += f", growing {edge.chunk_growth}x per chunk{cap}"
    return f"chunks of {sizes}, each frame decoded once"


def _levels(args: argparse.Namespace) -> list[int]:
    levels = [int(c) for c in str(args.concurrency).split(",") if c.strip()]
    if not levels or min(levels) < 1:
        raise ValueError("--concurrency: expected comma-separated levels >= 1")
    for name in ("frames", "repeat"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name}: must be at least 1")
    return levels


def _qwen_peer_fields(best: Results, levels: list[int], alone: dict, batched: dict) -> dict:
    """qwen-tts against ours: RTF at the lowest level, aggregate at the highest."""
    low, high = min(levels), max(levels)
    rtf_gain = alone["rtf"] / best["stream"][low]["rtf_median"]
    aggregate = best["stream"][high]["audio_s_per_s"] / batched["audio_s_per_s"]
    print(
        f"reference: RTF {alone['rtf']:.3f} alone, {batched['audio_s_per_s']:.2f} audio s/s "
        f"batched 16; ours: RTF {rtf_gain:.2f}x better at c={low} (target >= 3), "
        f"{aggregate:.2f}x its aggregate at c={high} (target >= 10)"
    )
    return {
        "reference_rtf_c1": round(alone["rtf"], 4),
        "reference_batch16_audio_s_per_s": round(batched["audio_s_per_s"], 4),
        "ratio_rtf_vs_reference_c1": round(rtf_gain, 3),
        "ratio_aggregate_vs_reference_c16": round(aggregate, 3),
        "target_rtf_met": rtf_gain >= 3,
        "target_aggregate_met": aggregate >= 10,
    }


def _cosyvoice3_peer_fields(best: Results, peers: dict) -> dict:
    """The CosyVoice reference against ours at c=1, per mode, with the tokens of each."""
    fields = tts_cosyvoice3.compare({mode: best[mode][1] for mode in peers}, peers)
    for mode, peer in peers.items():
        print(
            f"reference {peer['mode']}: RTF {peer['rtf_median']:.3f}; its RTF / ours at c=1 "
            f"{fields[f'ratio_rtf_vs_reference_{mode}_c1']:.2f} (above 1: ours is faster); tokens "
            f"a request: ours {fields[f'{mode}_c1_tokens_per_request']}, reference "
            f"{peer['tokens']} written, {peer['spoken_tokens']} spoken (budget "
            f"{peer['budgets']})"
        )
    return fields | {"reference_voice": next(iter(peers.values()))["voice"]}


def main(args: argparse.Namespace) -> int:
    import torch

    levels = _levels(args)
    best = best_by_first_audio(run_mode, args, levels)
    alone = run_reference(args, n=2, batch=1)
    batched = run_reference(args, n=16, batch=16) if alone is not None else None
    peers = run_cosyvoice3_peer(args, levels)
    workload = _workload(args)
    flags = ",".join(cpu_flags()) or "none of avx2/avx512"
    machine = (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"flags {flags}, torch {torch.__version__}"
    )
    print(f"workload: {workload}\nmachine: {machine}")
    print(f"{'mode':<11}{'conc':>5}{'TTFA s':>9}{'RTF':>8}{'audio s/s':>11}")
    for transfer in ("stream", "payload"):
        for level in levels:
            r = best[transfer][level]
            print(
                f"{transfer:<11}{level:>5}{r['ttfa_median_s']:>9.3f}{r['rtf_median']:>8.3f}"
                f"{r['audio_s_per_s']:>11.2f}"
            )
    if peers is not None:
        tts_cosyvoice3.print_rows(peers)
    summary: dict[str, Any] = {"benchmark": "tts", "workload": workload, "machine": machine}
    summary |= flat_fields(best, levels)
    low = min(levels)
    ratio_first = best["stream"][low]["ttfa_median_s"] / best["payload"][low]["ttfa_median_s"]
    summary["ratio_ttfa_stream_vs_whole"] = round(ratio_first, 4)
    summary["target_first_audio_met"] = ratio_first <= 0.2
    print(f"stream / whole first audio at concurrency {low}: {ratio_first:.3f} (target <= 0.2)")
    if alone is not None and batched is not None:
        summary |= _qwen_peer_fields(best, levels, alone, batched)
    elif peers is not None:
        summary |= _cosyvoice3_peer_fields(best, peers)
    else:
        no_c1 = args.model == COSYVOICE3 and 1 not in levels
        why = "no c=1 level" if no_c1 else "not found"
        print(f"reference: skipped ({peer_python(args)}: {why})")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
