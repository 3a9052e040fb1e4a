"""`omnistage bench omni`: speech out on the built-in `demo-omni` (Qwen3-Omni architecture).

Workload (seeded): distinct chat prompts of 4-8 random lowercase words through the
packaged demo-omni pipeline (thinker -> talker -> code2wav, a process per stage,
random weights made locally once; nothing is downloaded). The thinker writes
`--thinker-tokens` tokens (greedy, ignore_eos), the talker `--talker-frames` frames
of codes (greedy, repetition penalty 1.05, ignore_eos), code2wav turns frames into
24 kHz audio (64 samples per frame in the tiny model, as 1920 in the real one).

Per concurrency (`--concurrency`, default 1 and 16) and mode, all requests of a
measurement are submitted at once through `AsyncOmni`:

- `stream` (the packaged deploy): the thinker streams its rows to the talker (first
  chunk at its 2nd token, then every 8), which starts at once and takes one text row
  per frame; codes stream talker -> code2wav in chunks (first 4 frames, then 16, with
  32 frames of left context);
- `payload`: every edge carries a whole payload when its producer has finished.

Reported: time to first audio packet (TTFA: submit -> first update bringing audio;
median over requests), real-time factor (a request's end-to-end time / its audio
duration; median), audio seconds per wall second and thinker tokens per wall second
(all requests / the measurement's wall time). The peer, measured in the same run:
transformers' `Qwen3OmniMoeForConditionalGeneration.generate` on the same
checkpoint (greedy thinker and talker, one request at a time — it batches
neither), its audio seconds per wall second against ours at concurrency 1.

Repeats are interleaved and the run with the lowest median TTFA is kept. A table,
then one JSON line.
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
from omnistage.benchmarks.speech_runs import best_by_first_audio, flat_fields, speech_deploy

LAST_STAGE = "code2wav"
SAMPLE_RATE = 24000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--concurrency", default="1,16", help="comma-separated levels")
    parser.add_argument("--thinker-tokens", type=int, default=32)
    parser.add_argument("--talker-frames", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=2, help="interleaved runs; best reported")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="where every stage (and the peer) runs")


def _chat(words: str) -> str:
    return f"<|im_start|>user\n{words}<|im_end|>\n<|im_start|>assistant\n"


def _params(args: argparse.Namespace) -> dict[str, Any]:
    from omnistage import SamplingParams

    return {
        "thinker": SamplingParams(temperature=0, max_tokens=args.thinker_tokens, ignore_eos=True),
        "talker": SamplingParams(
            temperature=0,
            repetition_penalty=1.05,
            max_tokens=args.talker_frames,
            ignore_eos=True,
        ),
    }


async def _serve(omni: Any, prompts: list[str], params: dict[str, Any]) -> dict[str, float]:
    async def one(prompt: str) -> tuple[float, float, float, int]:
        submitted, first, samples, tokens = time.perf_counter(), None, 0, 0
        async for out in omni.generate(prompt, params):
            if out.error is not None:
                raise RuntimeError(f"request {out.request_id} failed: {out.error}")
            if out.stage == LAST_STAGE and out.new_data is not None and out.new_data.numel():
                first = first or time.perf_counter() - submitted
                samples += out.new_data.numel()
            if out.finished:
                tokens = len(out.token_ids or [])
        if first is None:
            raise RuntimeError("a request finished without audio")
        return first, time.perf_counter() - submitted, samples / SAMPLE_RATE, tokens

    start = time.perf_counter()
    results = await asyncio.gather(*(one(p) for p in prompts))
    wall = time.perf_counter() - start
    return {
        "ttfa_median_s": statistics.median(r[0] for r in results),
        "rtf_median": statistics.median(r[1] / r[2] for r in results),
        "audio_s_per_s": sum(r[2] for r in results) / wall,
        "text_tokens_per_s": sum(r[3] for r in results) / wall,
        "wall_s": wall,
    }


def run_mode(args: argparse.Namespace, transfer: str, levels: list[int], tag: str) -> dict:
    from omnistage.pipeline.omni import AsyncOmni

    params = _params(args)
    out = {}
    with AsyncOmni(speech_deploy("demo-omni", transfer, args.device)) as omni:
        asyncio.run(_serve(omni, [_chat("warm up")], params))
        for level in levels:
            prompts = [_chat(f"{tag} {p}") for p in make_prompts(level, args.seed + level)]
            out[level] = asyncio.run(_serve(omni, prompts, params))
    return out


def run_transformers(args: argparse.Namespace, n: int) -> dict[str, float]:
    """The peer: transformers' generate, one request at a time, greedy."""
    from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

    from omnistage.models.builtin import demo_model_path

    path = demo_model_path("demo-omni")
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(path, dtype=torch.float32)
    model = model.to(args.device)
    tok = AutoTokenizer.from_pretrained(path)
    prompts = [_chat(f"hf {p}") for p in make_prompts(n, args.seed)]
    audio_s, tokens = 0.0, 0
    start = time.perf_counter()
    with torch.no_grad():
        for prompt in prompts:
            ids = tok(prompt, return_tensors="pt").input_ids.to(args.device)
            sequences, wav = model.generate(
                ids,
                thinker_max_new_tokens=args.thinker_tokens,
                thinker_min_new_tokens=args.thinker_tokens,
                talker_max_new_tokens=args.talker_frames,
                thinker_do_sample=False,
                talker_do_sample=False,
                thinker_eos_token_id=model.config.im_end_token_id,
            )
            audio_s += wav.numel() / SAMPLE_RATE
            tokens += sequences.shape[1] - ids.shape[1]
    wall = time.perf_counter() - start
    return {"audio_s_per_s": audio_s / wall, "text_tokens_per_s": tokens / wall, "wall_s": wall}


def main(args: argparse.Namespace) -> int:
    levels = [int(c) for c in str(args.concurrency).split(",") if c.strip()]
    if not levels or min(levels) < 1:
        raise ValueError("--concurrency: expected comma-separated levels >= 1")
    for name in ("thinker_tokens", "talker_frames", "repeat"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}: must be at least 1")
    best = best_by_first_audio(run_mode, args, levels)
    hf = run_transformers(args, n=2)
    workload = (
        f"best of {args.repeat} (lowest median TTFA): demo-omni (tiny random-weight Qwen3-Omni, "
        f"{'float32' if args.device == 'cpu' else 'bfloat16, the peer float32'}), chat prompts of 4-8 random words, thinker {args.thinker_tokens} tokens "
        f"(greedy, ignore_eos), talker {args.talker_frames} frames (greedy, repetition penalty "
        "1.05, ignore_eos), a process per stage, async scheduling; stream: thinker->talker "
        "chunks of 2 then 8 tokens, talker->code2wav 4 then 16 frames with 32 frames of left "
        "context; payload: whole payloads on every edge; transformers peer: generate, one "
        "request at a time"
    )
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
    if args.device != "cpu":
        machine += f", every stage on {args.device} ({torch.cuda.get_device_name(args.device)})"
    print(f"workload: {workload}\nmachine: {machine}")
    print(f"{'mode':<9}{'conc':>5}{'TTFA s':>9}{'RTF':>8}{'audio s/s':>11}{'tok/s':>9}")
    for transfer in ("stream", "payload"):
        for level in levels:
            r = best[transfer][level]
            print(
                f"{transfer:<9}{level:>5}{r['ttfa_median_s']:>9.3f}{r['rtf_median']:>8.3f}"
                f"{r['audio_s_per_s']:>11.2f}{r['text_tokens_per_s']:>9.1f}"
            )
    print(
        f"transformers (one at a time): {hf['audio_s_per_s']:.2f} audio s/s, "
        f"{hf['text_tokens_per_s']:.1f} tok/s"
    )
    low = min(levels)
    ratio_ttfa = best["stream"][low]["ttfa_median_s"] / best["payload"][low]["ttfa_median_s"]
    ratio_hf = best["stream"][low]["audio_s_per_s"] / hf["audio_s_per_s"]
    print(f"stream / payload median TTFA at concurrency {low}: {ratio_ttfa:.3f} (target <= 0.2)")
    print(f"audio s/s vs transformers at concurrency {low}: {ratio_hf:.2f}x")
    summary: dict[str, Any] = {"benchmark": "omni", "workload": workload, "machine": machine}
    summary |= flat_fields(best, levels)
    summary |= {
        "transformers_audio_s_per_s": round(hf["audio_s_per_s"], 4),
        "transformers_text_tokens_per_s": round(hf["text_tokens_per_s"], 2),
        "ratio_ttfa_stream_vs_payload": round(ratio_ttfa, 4),
        "ratio_audio_s_per_s_vs_transformers": round(ratio_hf, 3),
        "target_ttfa_met": ratio_ttfa <= 0.2,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
