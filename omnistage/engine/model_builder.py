"""A model with its weights, built from a checkpoint, and the facts the engine reads from
its HF config (context length, text hidden size)."""

from __future__ import annotations

from typing import Any

import torch

from omnistage.models.base import CausalLM
from omnistage.models.gguf_quantized import (
    install_quantized,
    quantized_groups,
    read_quantized_weights,
)
from omnistage.models.loader import ModelFiles, iter_weights
from omnistage.models.parts import part_weights
from omnistage.models.registry import model_class_for
from omnistage.startup_phases import StartupPhases


def build_model(
    files: ModelFiles,
    hf_config: Any,
    dtype: torch.dtype,
    max_model_len: int,
    phases: StartupPhases | None = None,
    keep_quantized: bool = False,
    quant_activations: str | None = None,
) -> CausalLM:
    """The model with its weights; with `keep_quantized`, a GGUF's quantized weights stay in
    their blocks (`gguf_quantized`, products on the `quant_activations` path) and only the
    rest loads as floats."""
    phases = phases or StartupPhases()
    cls = model_class_for(hf_config)
    with phases.phase("model build"):
        model = cls(hf_config, dtype, max_model_len)
    with phases.phase("weights"):
        groups, quantized = [], {}
        if keep_quantized and files.gguf is not None and dtype == torch.float32:
            quantized = read_quantized_weights(files.gguf, hf_config)
            groups = quantized_groups(model, quantized)
        skip = {name for group in groups for name in group.hf_names}
        loaded = model.load_weights(part_weights(iter_weights(files.path, skip=skip), hf_config))
        install_quantized(model, groups, quantized, quant_activations)
    missing = sorted(model.expected_weight_names() - loaded)
    if missing:
        shown = ", ".join(missing[:5]) + (" …" if len(missing) > 5 else "")
        raise ValueError(f"checkpoint {files.path}: {len(missing)} weights missing: {shown}")
    return model.eval()


def model_max_len(hf_config: Any) -> int:
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = getattr(hf_config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return 2048


def text_hidden_size(hf_config: Any) -> int | None:
    """Hidden size of the (text) decoder the stage runs; None where the config has none."""
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    value = getattr(text, "hidden_size", None)
    return value if isinstance(value, int) else None
