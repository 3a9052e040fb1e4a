"""The packaged demo deploys serving a tiny checkpoint, as tests and benchmarks want them
(a dtype, sync or async, streamed or whole payloads)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from omnistage.pipeline.deploy import load_deploy, packaged_deploy_path


def tiny_qwen3_omni_deploy(
    path: Path, *, dtype: str = "float64", async_scheduling: bool = True, stream: bool = True
):
    """The packaged demo-omni deploy serving the checkpoint at `path`; with `stream=False`
    every edge carries a whole payload instead of stream chunks."""
    return tiny_speech_deploy(
        "demo-omni", path, dtype=dtype, async_scheduling=async_scheduling, stream=stream
    )


def tiny_speech_deploy(
    name: str,
    path: Path,
    *,
    dtype: str = "float64",
    async_scheduling: bool = True,
    stream: bool = True,
):
    """The packaged deploy `name` (demo-omni, demo-qwen3-tts) serving the checkpoint at
    `path`; with `stream=False` every stream edge carries a whole payload instead of chunks
    (other edges, e.g. a prompt edge, stay as they are)."""
    spec = load_deploy(packaged_deploy_path(name)).with_model(str(path))
    spec = spec.with_engine_args({"dtype": dtype, "async_scheduling": async_scheduling})
    if not stream:
        edges = tuple(
            dataclasses.replace(e, transfer="payload") if e.transfer == "stream" else e
            for e in spec.edges
        )
        spec = dataclasses.replace(spec, edges=edges)
    return spec


def tiny_image_deploy(path: Path, *, dtype: str = "float64", async_scheduling: bool = True):
    """The packaged demo-image deploy serving the checkpoint at `path` in `dtype`."""
    spec = load_deploy(packaged_deploy_path("demo-image")).with_model(str(path))
    return spec.with_engine_args({"dtype": dtype, "async_scheduling": async_scheduling})
