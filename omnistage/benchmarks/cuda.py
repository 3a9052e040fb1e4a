"""`omnistage bench cuda`: our engine on a CUDA device against HF transformers on the same
device, same run, same random-weight model.

Workloads (seeded, random prompt token ids, `ignore_eos`):
- offline throughput, nano-vllm's: `--num-seqs` sequences (256) of `--input-len` random
  prompt tokens (100-1024) and `--output-len` output tokens each (100-1024); ours as one
  `generate`, transformers' `generate` (static cache, SDPA, left-padded batches of
  `--hf-batch`; each batch runs to its longest output, only the tokens each sequence asked
  for are counted);
- one request: `--decode-tokens` (256) greedy tokens after a 128-token prompt: tokens/s
  and the time per output token.

The default model is Qwen3-0.6B's shape (28 layers, hidden 1024, 16 query / 8 KV heads of
128, intermediate 3072, vocabulary 151936) with random bfloat16 weights, made in
`--model-dir`. The report ends with one JSON line.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

QWEN3_0_6B = dict(
    vocab_size=151936,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
)


def make_model(directory: Path) -> Path:
    """A Qwen3-0.6B-shaped checkpoint with random bfloat16 weights (made once)."""
    if (directory / "config.json").exists():
        return directory
    from transformers import AutoModelForCausalLM, Qwen3Config

    from omnistage.models.tiny_checkpoints import byte_tokenizer

    torch.manual_seed(0)
    config = Qwen3Config(**QWEN3_0_6B)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(directory)
    byte_tokenizer().save_pretrained(directory)
    return directory


def workload(args: argparse.Namespace, vocab: int) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(args.seed)
    low_in, high_in = (int(x) for x in args.input_len.split("-"))
    low_out, high_out = (int(x) for x in args.output_len.split("-"))
    prompts = [
        [rng.randrange(3, vocab) for _ in range(rng.randint(low_in, high_in))]
        for _ in range(args.num_seqs)
    ]
    return prompts, [rng.randint(low_out, high_out) for _ in range(args.num_seqs)]


def run_ours(args: argparse.Namespace, path: Path, prompts, outputs) -> dict[str, Any]:
    from omnistage import LLM, SamplingParams

    llm = LLM(
        str(path),
        device="cuda",
        max_model_len=args.max_model_len,
        max_num_seqs=args.num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        async_scheduling=args.async_scheduling,
        enforce_eager=args.enforce_eager,
    )

    def greedy(n: int) -> SamplingParams:
        return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)

    llm.generate([{"prompt_token_ids": p} for p in prompts[:4]], greedy(8), use_tqdm=False)
    one = {"prompt_token_ids": prompts[0][:128]}
    started = time.perf_counter()
    out = llm.generate([one], greedy(args.decode_tokens), use_tqdm=False)
    single = time.perf_counter() - started
    assert len(out[0].outputs[0].token_ids) == args.decode_tokens
    started = time.perf_counter()
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        [greedy(n) for n in outputs],
        use_tqdm=False,
    )
    elapsed = time.perf_counter() - started
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    llm.engine.shutdown()
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return {"elapsed_s": elapsed, "output_tokens": tokens, "single_s": single}


def run_hf(args: argparse.Namespace, path: Path, prompts, outputs) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.bfloat16, attn_implementation="sdpa"
    ).to("cuda")
    model.eval()
    options = dict(
        do_sample=False, pad_token_id=0, cache_implementation="static", disable_compile=True
    )

    def generate(model: Any, batch: list[list[int]], new: int) -> None:
        width = max(map(len, batch))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch], device="cuda")
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device="cuda")
        model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, **options)
        torch.cuda.synchronize()

    with torch.inference_mode():
        generate(model, [prompts[0][:16]], 4)
        started = time.perf_counter()
        generate(model, [prompts[0][:128]], args.decode_tokens)
        single = time.perf_counter() - started
        started = time.perf_counter()
        for i in range(0, len(prompts), args.hf_batch):
            generate(model, prompts[i : i + args.hf_batch], max(outputs[i : i + args.hf_batch]))
        elapsed = time.perf_counter() - started
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return {"elapsed_s": elapsed, "output_tokens": sum(outputs), "single_s": single}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="an HF checkpoint dir (default: random)")
    parser.add_argument("--model-dir", default=None, help="where the random model is made")
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--input-len", default="100-1024")
    parser.add_argument("--output-len", default="100-1024")
    parser.add_argument("--decode-tokens", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--hf-batch", type=int, default=64)
    parser.add_argument("--peers", default="omnistage,transformers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--enforce-eager", action="store_true", help="ours without CUDA graphs")


def main(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        raise SystemExit("bench cuda: torch sees no CUDA device")
    directory = Path(args.model_dir or tempfile.mkdtemp(prefix="omnistage-qwen3-0.6b-"))
    path = Path(args.model) if args.model else make_model(directory)
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    prompts, outputs = workload(args, vocab)
    results = {}
    for peer in args.peers.split(","):
        run = run_ours if peer == "omnistage" else run_hf
        results[peer] = run(args, path, prompts, outputs)
        r = results[peer]
        r["tokens_per_s"] = r["output_tokens"] / r["elapsed_s"]
        r["single_tokens_per_s"] = args.decode_tokens / r["single_s"]
        r["single_tpot_ms"] = 1000 * r["single_s"] / args.decode_tokens
        print(
            f"{peer:14s} offline {r['tokens_per_s']:9.1f} tok/s ({r['output_tokens']} tokens, "
            f"{r['elapsed_s']:.1f} s); one request {r['single_tokens_per_s']:.1f} tok/s, "
            f"TPOT {r['single_tpot_ms']:.2f} ms"
        )
    report = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "workload": {
            "num_seqs": args.num_seqs,
            "input_len": args.input_len,
            "output_len": args.output_len,
            "decode_tokens": args.decode_tokens,
        },
        "enforce_eager": args.enforce_eager,
        "results": results,
    }
    if "omnistage" in results and "transformers" in results:
        ours, hf = results["omnistage"], results["transformers"]
        report["offline_ratio_vs_hf"] = ours["tokens_per_s"] / hf["tokens_per_s"]
        report["single_ratio_vs_hf"] = ours["single_tokens_per_s"] / hf["single_tokens_per_s"]
    print(json.dumps(report))
    return 0
