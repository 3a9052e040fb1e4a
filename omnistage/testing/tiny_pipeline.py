"""A tiny three-stage pipeline for tests and benchmarks: thinker → talker → vocoder.

The thinker is a tiny llama that writes text; the talker, another tiny llama,
starts from the thinker's hidden states as prompt embeddings (a `payload`
edge; or, with `thinker_transfer="stream"`, from the first chunk of them, each
later hidden state conditioning one talker step as it arrives) and writes "codes"; the vocoder (`TinyCodeVocoder`) turns the codes
into a waveform, fed chunk by chunk (`stream`) or in one piece (`payload`).
All weights are random and seeded: outputs are noise, but deterministic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from omnistage.families.tiny_codec.vocoder import make_tiny_vocoder
from omnistage.models.tiny_checkpoints import make_checkpoint


def make_tiny_omni(path: Path) -> Path:
    """One checkpoint directory with a subdirectory per part (made once)."""
    path = Path(path)
    if not (path / "vocoder" / "model.safetensors").exists():
        make_checkpoint(path / "thinker", "llama", seed=1, dtype=torch.float64)
        make_checkpoint(path / "talker", "llama", seed=2, dtype=torch.float64)
        make_tiny_vocoder(path / "vocoder")
    return path


def tiny_pipeline_deploy(
    model: Path,
    *,
    transfer: str = "stream",
    thinker_transfer: str = "payload",
    async_scheduling: bool = False,
    executor_backend: str = "auto",
    dtype: str = "float64",
    connector: str = "shm",
    thinker_tokens: int = 12,
    talker_tokens: int = 20,
    chunk_size: int = 4,
    first_chunk_size: int = 2,
    left_context: int = 4,
    input_timeout_s: float = 60.0,
    max_num_seqs: int = 64,
    ar_engine_args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The deploy mapping of the tiny pipeline (what a deploy YAML file would hold)."""
    ar_args = {
        "dtype": dtype,
        "max_num_seqs": max_num_seqs,
        "async_scheduling": async_scheduling,
        "executor_backend": executor_backend,
        **(ar_engine_args or {}),
    }
    stream = dict(
        chunk_size=chunk_size, first_chunk_size=first_chunk_size, left_context=left_context
    )

    return {
        "name": "tiny-omni",
        "connectors": {} if connector in ("shm", "inproc") else {connector: {"kind": connector}},
        "stages": [
            _stage(
                model,
                0,
                "thinker",
                "ar",
                ar_args,
                default_sampling=_greedy(thinker_tokens),
                final_output=True,
                final_output_type="text",
            ),
            _stage(
                model,
                1,
                "talker",
                "ar",
                ar_args,
                default_sampling=_greedy(talker_tokens),
                input_timeout_s=input_timeout_s,
            ),
            _stage(
                model,
                2,
                "vocoder",
                "generation",
                {"dtype": dtype, "max_num_seqs": max_num_seqs},
                final_output=True,
                final_output_type="audio",
                input_timeout_s=input_timeout_s,
            ),
        ],
        "edges": [
            _edge("thinker", "talker", "hidden_to_embeds", thinker_transfer, connector, stream),
            _edge("talker", "vocoder", "ids_to_codes", transfer, connector, stream),
        ],
    }


def _stage(
    model: Path, i: int, name: str, kind: str, engine_args: dict, **extra: Any
) -> dict[str, Any]:
    """Stage `i` of the deploy: `name` is also the checkpoint part it runs."""
    head = {"id": i, "name": name, "kind": kind, "model": str(model), "model_part": name}
    return {**head, "engine_args": engine_args, **extra}


def _edge(
    src: str, dst: str, processor: str, transfer: str, connector: str, stream: dict[str, int]
) -> dict[str, Any]:
    """An edge; a streamed one carries the chunking (`stream`)."""
    head = {"from": src, "to": dst, "processor": processor, "transfer": transfer}
    return {**head, "connector": connector, **(stream if transfer == "stream" else {})}


def _greedy(max_tokens: int) -> dict[str, Any]:
    return {"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True}
