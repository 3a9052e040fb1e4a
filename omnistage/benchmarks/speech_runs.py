"""What the speech benchmarks (`bench omni`, `bench tts`) share: a demo deploy streamed or
with whole payloads, interleaved repeats keeping the run with the lowest median time to
first audio, and the results as flat JSON fields."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any

MODES = ("stream", "payload")
Results = dict[str, dict[int, dict[str, float]]]
"""mode -> concurrency -> measurement."""


def speech_deploy(name: str, transfer: str, device: str = "cpu") -> Any:
    """The packaged deploy `name`; with `transfer="payload"` every edge carries a whole
    payload instead of stream chunks; every stage on `device` (cpu, cuda)."""
    from omnistage.pipeline.deploy import deploy_for_model

    spec = deploy_for_model(name)
    if device != "cpu":
        spec = spec.with_engine_args({"device": device})
    if transfer == "payload":
        edges = tuple(dataclasses.replace(e, transfer="payload") for e in spec.edges)
        spec = dataclasses.replace(spec, edges=edges)
    return spec


def best_by_first_audio(
    run_mode: Callable[[argparse.Namespace, str, list[int], str], dict[int, dict[str, float]]],
    args: argparse.Namespace,
    levels: list[int],
) -> Results:
    """`args.repeat` interleaved runs of each mode; per mode and level, the run with the
    lowest median TTFA."""
    best: Results = {}
    for i in range(args.repeat):
        for transfer in MODES[:: -1 if i % 2 else 1]:
            for level, r in run_mode(args, transfer, levels, f"{transfer[:3]}{i}").items():
                kept = best.setdefault(transfer, {}).get(level)
                if kept is None or r["ttfa_median_s"] < kept["ttfa_median_s"]:
                    best[transfer][level] = r
    return best


def flat_fields(best: Results, levels: list[int]) -> dict[str, float]:
    """`{mode}_c{level}_{key}` for every measurement, rounded for the JSON line."""
    return {
        f"{transfer}_c{level}_{key}": round(value, 4)
        for transfer in MODES
        for level in levels
        for key, value in best[transfer][level].items()
    }
