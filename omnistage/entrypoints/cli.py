"""The `omnistage` command line: generate, serve, models, bench, verify.

omnistage generate "PROMPT" [--model smollm2] [--chat] [--max-tokens N] [--temperature T] ...
omnistage generate "PROMPT" --deploy FILE|NAME [--model PATH] [--modalities text,audio] [--out DIR]
omnistage generate "PROMPT" --model demo-omni|OMNI_CHECKPOINT [--modalities text,audio] [--out DIR]
omnistage generate "PROMPT" --model demo-image|GLM_IMAGE_CHECKPOINT [--height H --width W] [--out DIR]
    (omni checkpoints and demos run their packaged pipeline, with the chat template)
omnistage serve [--model smollm2] [--host 127.0.0.1] [--port 8000] [--api-key KEY] [--served-model-name NAME]
omnistage serve --model demo-image|demo-omni|PIPELINE_CHECKPOINT | --deploy FILE|NAME [--in-process]
omnistage serve --ui ...  (or omnistage playground ...): also a browser playground at /ui/
omnistage models
omnistage bench throughput [--model ...] [--num-prompts 64 --input-len 128 --output-len 64]
omnistage bench pipeline [--concurrency 32] [--thinker-tokens 32] [--talker-tokens 64] [--repeat 2]
omnistage bench omni [--concurrency 1,16] [--thinker-tokens 32] [--talker-frames 128] [--repeat 2]
omnistage bench soak [--generations 20480] [--concurrency 16] [--abort-fraction 0.2] [--out FILE]
omnistage verify [--model smollm2|demo-omni|PATH] [--deploy FILE|NAME] [--short] [--requests N] [--json]
"""

from __future__ import annotations

import argparse
import atexit
import gc
import importlib
import logging
import os
import sys
from collections.abc import Collection
from typing import Any

from omnistage.config import DEFAULT_MODEL
from omnistage.entrypoints.serve_options import add_serve_options


def _add_engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=None,
        help=f"built-in name, HF checkpoint dir or .gguf file (default {DEFAULT_MODEL}; with "
        "--deploy: the model of the stages that name none)",
    )
    parser.add_argument(
        "--dtype", default="auto", help="auto (float32), float32, bfloat16, float64"
    )
    parser.add_argument(
        "--quant-activations",
        choices=("float32", "int8"),
        default=None,
        help="GGUF quantized weights: float32 activations (default) or int8 ones with integer "
        "dot products, as llama.cpp (faster; greedy text may differ)",
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
    parser.add_argument(
        "--speculative-config",
        default=None,
        help='speculative decoding as JSON, e.g. \'{"method": "ngram", '
        '"num_speculative_tokens": 4}\' (methods: ngram, draft_model with "model", mtp)',
    )
    parser.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    parser.add_argument("--num-threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.9,
        help="CUDA: fraction of the device's memory the stage may take (KV cache sized from it)",
    )
    parser.add_argument(
        "--enforce-eager", action="store_true", help="CUDA: decode steps without CUDA graphs"
    )


def _engine_kwargs(args: argparse.Namespace) -> dict:
    return {
        "dtype": args.dtype,
        "quant_activations": args.quant_activations,
        "max_model_len": args.max_model_len,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "enable_prefix_caching": args.enable_prefix_caching,
        "enable_chunked_prefill": args.enable_chunked_prefill,
        "async_scheduling": args.async_scheduling,
        "speculative_config": args.speculative_config,
        "kv_cache_memory_bytes": args.kv_cache_memory_bytes,
        "num_threads": args.num_threads,
        "device": args.device,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "enforce_eager": args.enforce_eager,
        "seed": args.seed if args.seed is not None else 0,
    }


def cmd_generate(args: argparse.Namespace) -> int:
    if args.deploy is None and args.model is not None:
        from omnistage.entrypoints.entry_prompt import entry_builds_its_prompt
        from omnistage.pipeline.deploy import deploy_for_model

        spec = deploy_for_model(args.model)
        if spec.is_pipeline:  # an omni checkpoint or demo: its packaged pipeline
            args.deploy, args.model = spec, None
            args.chat = not entry_builds_its_prompt(spec)
    if args.deploy is not None:
        from omnistage.entrypoints.generate_pipeline import generate_pipeline

        return generate_pipeline(args)
    from omnistage import LLM, SamplingParams

    params = SamplingParams(
        temperature=0.0 if args.temperature is None else args.temperature,
        top_p=1.0 if args.top_p is None else args.top_p,
        top_k=0 if args.top_k is None else args.top_k,
        max_tokens=128 if args.max_tokens is None else args.max_tokens,
        seed=args.seed,
        n=args.n,
    )
    llm = LLM(args.model or DEFAULT_MODEL, **_engine_kwargs(args))
    if args.chat:
        outs = llm.chat([{"role": "user", "content": args.prompt}], params, use_tqdm=False)
    else:
        outs = llm.generate(args.prompt, params, use_tqdm=False)
    for completion in outs[0].outputs:
        print(completion.text)
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from omnistage.models import registry
    from omnistage.models.builtin import describe_builtin_models
    from omnistage.models.registry import deploys_by_model_type, supported_architectures

    print("Built-in models:")
    for name, description, where in describe_builtin_models():
        print(f"  {name:<10} {description}\n  {'':<10} from: {where}")
    print("Supported checkpoint architectures (HF dir or GGUF):")
    print("  " + ", ".join(supported_architectures()))
    print("Omni checkpoints (HF dir), served as multi-stage pipelines with a packaged deploy:")
    for model_type, deploy in sorted(deploys_by_model_type().items()):
        print(f"  model_type {model_type:<16} deploy {deploy}")
    for arch in registry.layout_architectures():
        print(f"  architectures {arch} (as published; its family's deploy, through a view)")
    return 0


BENCHMARKS = {
    "cuda": "on a CUDA device: offline tokens/s and one request's TPOT against HF",
    "throughput": "output tokens/s against HF transformers",
    "pipeline": "the tiny three-stage pipeline: overlap and time to first audio",
    "omni": "speech out on demo-omni: time to first audio, streaming vs whole payload",
    "tts": "text to speech on demo-qwen3-tts (or --model demo-cosyvoice3): first audio, RTF",
    "image": "images out on demo-image: step-level batching vs one at a time",
    "serve": "an OpenAI-compatible server over HTTP: TTFT, TPOT, ITL, throughput",
    "startup": "fresh process to first token: script, serve, HF transformers",
    "latency": "one request's decode tokens/s per GGUF format, vs llama-bench",
    "soak": "a long mixed load with aborts: sync = async = speculative outputs, no leaks",
}
"""`omnistage bench NAME`: each is the module `omnistage.benchmarks.NAME`, with
`add_arguments(parser)` and `main(args)`."""


def _benchmark(name: str) -> Any:
    return importlib.import_module(f"omnistage.benchmarks.{name}")


def cmd_bench(args: argparse.Namespace) -> int:
    return _benchmark(args.bench).main(args)


def _add_verify_arguments(parser: argparse.ArgumentParser) -> None:
    from omnistage.entrypoints.verify.command import add_arguments

    add_arguments(parser)


def cmd_verify(args: argparse.Namespace) -> int:
    from omnistage.entrypoints.verify.command import main as verify_main

    return verify_main(args)


def cmd_serve(args: argparse.Namespace) -> int:
    launched = _early_text_worker(args)
    from omnistage.entrypoints.openai.api_server import serve
    from omnistage.entrypoints.openai.slow_clients import SlowClientLimits

    slow_clients = SlowClientLimits(
        header_timeout_s=args.header_timeout_s,
        read_timeout_s=args.read_timeout_s,
        max_connections=args.max_connections,
    )
    if args.ui:
        print(f"omnistage: playground at http://{args.host}:{args.port}/ui/", file=sys.stderr)
    return serve(
        args.model if args.deploy is not None else (args.model or DEFAULT_MODEL),
        _engine_kwargs(args),
        host=args.host,
        port=args.port,
        api_key=args.api_key or os.environ.get("OMNISTAGE_API_KEY") or None,
        served_model_names=args.served_model_name,
        log_level=args.log_level,
        deploy=args.deploy,
        in_process=args.in_process,
        launched=launched,
        max_request_bytes=args.max_request_bytes,
        slow_clients=slow_clients,
        ui=args.ui,
    )


def _early_text_worker(args: argparse.Namespace) -> Any:
    """The runner worker of a plain text model, started before the server's imports
    (FastAPI, uvicorn, the engine: ~1.6 s) so that they overlap its start, as `LLM(...)`
    does. None for a deploy, and for a model whose config is not a cached `PlainConfig`
    (pipelines and other families: the server starts them as before)."""
    if args.deploy is not None:
        return None
    import signal

    from omnistage.config import EngineConfig
    from omnistage.engine.worker_launch import launch_worker
    from omnistage.models.loader import load_hf_config, resolve_model
    from omnistage.models.plain_config import PlainConfig

    model = args.model or DEFAULT_MODEL
    try:
        if not isinstance(load_hf_config(resolve_model(model)), PlainConfig):
            return None
        config = EngineConfig(model=model, **_engine_kwargs(args))
    except (ValueError, OSError):  # e.g. a pipeline folder without config.json (demo-image)
        return None  # the server reports it, as without the early start
    # Like `serve`'s own start: the worker inherits an ignored SIGINT (Ctrl-C reaches only
    # the server, which shuts the worker down).
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return launch_worker(config)
    finally:
        signal.signal(signal.SIGINT, previous)


def _add_serve_parser(sub: argparse._SubParsersAction, name: str = "serve") -> None:
    """`omnistage serve`, or `omnistage playground`: the same with --ui on."""
    playground = name == "playground"
    help_text = "serve a model over an OpenAI-compatible HTTP API"
    srv = sub.add_parser(
        name, help=help_text + (" with the browser playground" if playground else "")
    )
    add_serve_options(srv, ui=playground)
    _add_engine_args(srv)
    srv.set_defaults(func=cmd_serve)


def build_parser(benchmarks: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The CLI's parser. Each benchmark's own arguments are added for the names in
    `benchmarks` only (None: all): adding them imports the benchmark's module, which
    imports torch, and `omnistage serve` must not pay that before it starts its worker."""
    parser = argparse.ArgumentParser(prog="omnistage", description="omnistage inference engine")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text for one prompt")
    gen.add_argument("prompt")
    gen.add_argument("--chat", action="store_true", help="apply the model's chat template")
    gen.add_argument("--max-tokens", type=int, default=None, help="default 128 (one model)")
    gen.add_argument("--temperature", type=float, default=None, help="default 0 (one model)")
    gen.add_argument("--top-p", type=float, default=None)
    gen.add_argument("--top-k", type=int, default=None)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("-n", type=int, default=1, help="number of samples")
    gen.add_argument(
        "--deploy",
        default=None,
        help="run a pipeline: a deploy YAML file or a packaged deploy name; sampling flags "
        "then apply to its first stage (on top of the file's defaults)",
    )
    gen.add_argument("--modalities", default=None, help="e.g. text or text,audio (pipelines)")
    gen.add_argument(
        "--out", default=None, help="write text.txt, audio.wav, image.png here (pipelines)"
    )
    images = gen.add_argument_group("images (pipelines that draw; default: the model's)")
    images.add_argument("--height", type=int, default=None)
    images.add_argument("--width", type=int, default=None)
    images.add_argument("--num-inference-steps", type=int, default=None)
    images.add_argument("--guidance-scale", type=float, default=None)
    images.add_argument("--negative-prompt", default=None)
    speech = gen.add_argument_group("speech (pipelines that speak)")
    speech.add_argument("--voice", default=None, help="one of the model's speakers")
    speech.add_argument(
        "--instructions", default=None, help="how to speak (TTS models; VoiceDesign: the voice)"
    )
    speech.add_argument("--language", default=None, help="the language to speak (TTS models)")
    gen.add_argument(
        "--in-process", action="store_true", help="run every stage in this process (debugging)"
    )
    _add_engine_args(gen)
    gen.set_defaults(func=cmd_generate)

    _add_serve_parser(sub)
    _add_serve_parser(sub, "playground")

    models = sub.add_parser("models", help="list built-in models and supported architectures")
    models.set_defaults(func=cmd_models)

    verify = sub.add_parser(
        "verify",
        help="check sync = async = speculative = alone on a model or pipeline (exit 1 if not)",
    )
    _add_verify_arguments(verify)
    verify.set_defaults(func=cmd_verify)

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    for name, help_text in BENCHMARKS.items():
        bench_parser = bench_sub.add_parser(name, help=help_text)
        if benchmarks is None or name in benchmarks:
            _benchmark(name).add_arguments(bench_parser)
        bench_parser.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    # Registered first, so it runs after every other exit handler: the interpreter's last
    # garbage collections then skip the objects alive at exit. Walking torch's and
    # transformers' millions of objects made up most of an exit (`serve` on SIGTERM:
    # ~0.9 s -> ~0.35 s). Safe here, where every file the command writes is closed by
    # the command; a library never does this to a user's program.
    atexit.register(gc.freeze)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    # Only `omnistage bench NAME ...` needs a benchmark's arguments (the name follows "bench").
    named = argv[1:2] if argv[:1] == ["bench"] else []
    args = build_parser(benchmarks=named).parse_args(argv)
    try:
        return args.func(args)
    except ValueError as exc:
        print(f"omnistage: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
