"""`python -m omnistage.benchmarks.quant_kernels`: GGUF-quantized linears against float32 GEMMs.

For SmolLM2-135M's linear shapes (576->1536, 1536->576, 576->576, 576->192 and
the 576->49152 LM head), seeded random weights quantized with gguf's
quantizer, run through `QuantizedLinear` (our kernels: each of `--activations`,
the int8 path and the float32 one, on each of `--isas`), against the float32
weight through `F.linear` (MKL) and through oneDNN with the weight pre-packed
(`PackedLinear`'s path), for M rows of x, on 1 and 2 threads (torch's and the
kernels' thread counts both set).

A decode step reads the whole model, which does not fit in the caches, so each
case cycles through enough copies of its weights to read `--rotate-mb` MB
(default 96, three times this machine's L3) before reusing one. Each time is
the median of `--batches` batches of at least `--seconds` each, after a
warm-up batch. "GB/s" is weight bytes read per second (the packed bytes for
the quantized kernel, 4 bytes per weight for float32). Prints the CPU, its
vector flags, a table, and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType, quants

from omnistage.kernels import work_sharing
from omnistage.layers import quantized_linear
from omnistage.layers.quant_paths import ISA_NAMES
from omnistage.layers.quantized_linear import QuantizedLinear

SHAPES = [(576, 1536), (1536, 576), (576, 576), (576, 192), (576, 49152)]
"""(in_features, out_features) of SmolLM2-135M's linears and tied LM head."""
FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16")


def cpu_description() -> tuple[str, list[str]]:
    """The CPU's model name and which of FLAGS it has."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine(), []
    model = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "")
    flags = next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), [])
    return model, [f for f in FLAGS if f in flags]


def time_us(calls: list[Callable[[], object]], seconds: float, batches: int) -> float:
    """Median over batches of the mean time of one call, cycling through `calls`."""

    def batch() -> float:
        n, start = 0, time.perf_counter()
        while n < len(calls) or time.perf_counter() - start < seconds:
            calls[n % len(calls)]()
            n += 1
        return (time.perf_counter() - start) / n * 1e6

    batch()  # warm-up
    return statistics.median(batch() for _ in range(batches))


def copies_for(nbytes: int, rotate_mb: float) -> int:
    return max(1, -(-int(rotate_mb * 2**20) // nbytes))


def float_impls(weight: torch.Tensor, rotate_mb: float) -> dict[str, list[torch.Tensor]]:
    """Copies of the float32 weight for F.linear, and oneDNN-packed ones."""
    n = copies_for(weight.numel() * 4, rotate_mb)
    plain = [weight.clone() for _ in range(n)]
    impls = {"f32 F.linear": plain}
    if torch.backends.mkldnn.is_available():
        impls["f32 oneDNN packed"] = [
            torch.ops.mkldnn._reorder_linear_weight(w, None) for w in plain
        ]
    return impls


Case = tuple[list[Callable[[], object]], int]
"""Calls computing the same product on different copies of the weight, and the
weight bytes one call reads."""


def cases_for(
    x: torch.Tensor,
    quantized: dict[str, list[QuantizedLinear]],
    floats: dict[str, list[torch.Tensor]],
) -> dict[str, Case]:
    """Each implementation's calls on the activations `x`."""
    cases: dict[str, Case] = {
        name: ([lambda layer=layer: layer(x) for layer in layers], layers[0].blocks.numel())
        for name, layers in quantized.items()
    }
    for name, weights in floats.items():
        if name == "f32 F.linear":
            calls = [lambda w=w: F.linear(x, w) for w in weights]
        else:
            calls = [
                lambda w=w: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
                for w in weights
            ]
        cases[name] = (calls, 4 * floats["f32 F.linear"][0].numel())
    return cases


def run_shape(
    k: int, n: int, args: argparse.Namespace, rng: np.random.Generator
) -> list[dict[str, object]]:
    weight = rng.standard_normal((n, k)).astype(np.float32) * 0.05
    quantized = {}
    for name in args.types:
        ggml_type = GGMLQuantizationType[name]
        stored = np.ascontiguousarray(quants.quantize(weight, ggml_type))
        blocks = torch.from_numpy(stored.view(np.uint8))  # F32/F16 come back as floats
        copies = copies_for(blocks.numel(), args.rotate_mb)
        for activations in args.activations:
            for isa in args.isas:
                quantized[f"{name} {activations} {isa}"] = [
                    QuantizedLinear(
                        blocks.clone(), ggml_type, k, n, None, ISA_NAMES[isa], activations
                    )
                    for _ in range(copies)
                ]
    floats = float_impls(torch.from_numpy(weight), args.rotate_mb) if args.floats else {}
    rows = []
    for m in args.m:
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
        cases = cases_for(x, quantized, floats)
        for threads in args.threads:
            torch.set_num_threads(threads)
            work_sharing.set_num_threads(threads)
            for impl, (calls, nbytes) in cases.items():
                us = time_us(calls, args.seconds, args.batches)
                gb_per_s = nbytes / us / 1e3
                rows.append(
                    dict(shape=f"{k}->{n}", m=m, threads=threads, impl=impl, us=round(us, 1))
                    | dict(gb_per_s=round(gb_per_s, 2))
                )
                print(
                    f"{k:>5}->{n:<6} M={m:<3} threads={threads} {impl:<20} "
                    f"{us:10.1f} us {gb_per_s:7.2f} GB/s",
                    flush=True,
                )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", type=lambda s: s.split(","), default=["Q4_1", "Q8_0"])
    parser.add_argument("--m", type=lambda s: [int(v) for v in s.split(",")], default=[1, 64])
    parser.add_argument("--threads", type=lambda s: [int(v) for v in s.split(",")], default=[1, 2])
    parser.add_argument("--activations", type=lambda s: s.split(","), default=["int8", "float32"])
    parser.add_argument("--isas", type=lambda s: s.split(","), default=["avx512"])
    parser.add_argument(
        "--floats",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="time F.linear, oneDNN",
    )
    parser.add_argument(
        "--parallel-bytes",
        type=int,
        default=None,
        help="QuantizedLinear's PARALLEL_WEIGHT_BYTES (products from this size use every thread)",
    )
    parser.add_argument("--rotate-mb", type=float, default=96.0)
    parser.add_argument("--seconds", type=float, default=0.05)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.parallel_bytes is not None:
        quantized_linear.PARALLEL_WEIGHT_BYTES = args.parallel_bytes

    model, flags = cpu_description()
    print(f"CPU: {model}; flags: {' '.join(flags)}; torch {torch.__version__}")
    before = torch.get_num_threads()
    rng = np.random.default_rng(args.seed)
    results = []
    try:
        for k, n in SHAPES:
            results += run_shape(k, n, args, rng)
    finally:
        torch.set_num_threads(before)
        work_sharing.set_num_threads(work_sharing.available_cores())
    settings = {key: value for key, value in vars(args).items()}
    print(
        json.dumps(
            dict(bench="quant_kernels", cpu=model, flags=flags, settings=settings, results=results)
        )
    )


if __name__ == "__main__":
    main()
