"""The `omnistage` command line: generate, models, bench.

omnistage generate "PROMPT" [--model smollm2] [--chat] [--max-tokens N] [--temperature T] ...
omnistage models
omnistage bench throughput [--model ...] [--num-prompts 64 --input-len 128 --output-len 64]
omnistage bench pipeline [--concurrency 32] [--thinker-tokens 32] [--talker-tokens 64] [--repeat 2]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from omnistage.config import DEFAULT_MODEL


def _add_engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help="built-in name, HF checkpoint dir or .gguf file"
    )
    parser.add_argument(
        "--dtype", default="auto", help="auto (float32), float32, bfloat16, float64"
    )
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument(
        "--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True
    )
    parser.add_argument(
        "--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True
    )
    parser.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="schedule step N+1 while step N runs (same outputs, less idle time)",
    )
    parser.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    parser.add_argument("--num-threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")


def _engine_kwargs(args: argparse.Namespace) -> dict:
    return {
        "dtype": args.dtype,
        "max_model_len": args.max_model_len,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "enable_prefix_caching": args.enable_prefix_caching,
        "enable_chunked_prefill": args.enable_chunked_prefill,
        "async_scheduling": args.async_scheduling,
        "kv_cache_memory_bytes": args.kv_cache_memory_bytes,
        "num_threads": args.num_threads,
        "device": args.device,
        "seed": args.seed if args.seed is not None else 0,
    }


def cmd_generate(args: argparse.Namespace) -> int:
    from omnistage import LLM, SamplingParams

    params = SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_tokens=args.max_tokens,
        seed=args.seed,
        n=args.n,
    )
    llm = LLM(args.model, **_engine_kwargs(args))
    if args.chat:
        outs = llm.chat([{"role": "user", "content": args.prompt}], params, use_tqdm=False)
    else:
        outs = llm.generate(args.prompt, params, use_tqdm=False)
    for completion in outs[0].outputs:
        print(completion.text)
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from omnistage.models.builtin import describe_builtin_models
    from omnistage.models.registry import supported_architectures

    print("Built-in models:")
    for name, description, where in describe_builtin_models():
        print(f"  {name:<10} {description}\n  {'':<10} from: {where}")
    print("Supported checkpoint architectures (HF dir or GGUF):")
    print("  " + ", ".join(supported_architectures()))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    if args.bench == "pipeline":
        from omnistage.benchmarks import pipeline

        return pipeline.main(args)
    from omnistage.benchmarks import throughput

    return throughput.main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omnistage", description="omnistage inference engine")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text for one prompt")
    gen.add_argument("prompt")
    gen.add_argument("--chat", action="store_true", help="apply the model's chat template")
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("-n", type=int, default=1, help="number of samples")
    _add_engine_args(gen)
    gen.set_defaults(func=cmd_generate)

    models = sub.add_parser("models", help="list built-in models and supported architectures")
    models.set_defaults(func=cmd_models)

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    tp = bench_sub.add_parser("throughput", help="output tokens/s against HF transformers")
    from omnistage.benchmarks.throughput import add_arguments

    add_arguments(tp)
    tp.set_defaults(func=cmd_bench)
    pl = bench_sub.add_parser(
        "pipeline", help="the tiny three-stage pipeline: overlap and time to first audio"
    )
    from omnistage.benchmarks import pipeline

    pipeline.add_arguments(pl)
    pl.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as exc:
        print(f"omnistage: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
