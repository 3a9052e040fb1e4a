"""float32 linear layers on our C kernels instead of oneDNN, for models that ask for it.

A model whose class sets `float_linears_on_kernels = True` (a stage whose steps are
decodes of a few rows: a talker) gets its float32 `Linear`s as `QuantizedLinear`s of
type F32 over the same bytes (no copy): the kernels the GGUF formats run, read as
blocks of 32 floats (`kernels/quant_matmul.c`). Then its decode steps run as one C
call (`layers/decode_program.py`), its LM head on the program's own thread pool, and a
row's result is the same alone or in any batch.

Why only where asked: at one row the kernels read float32 weights as fast as oneDNN's
packed GEMM (~28 GB/s on two Zen 4 cores, 2026-11-27), and the whole step gains more
(SmolLM2-135M float32: 33 -> 43 tok/s, mostly because oneDNN's OpenMP team no longer
spins beside the program's threads); but at 64-512 rows oneDNN's GEMM is ~1.35x faster,
so a model that prefills long prompts (a thinker, an LLM) keeps oneDNN
(docs/performance.md).

Parts that read their weights themselves (`keeps_plain_linears`) are left alone, and so
are layers whose inputs are not a multiple of 32 wide (the kernels' block).
"""

from __future__ import annotations

import logging
import os

import torch
from torch import nn

from omnistage import kernels
from omnistage.layers.decode_program import DISABLE_ENV
from omnistage.layers.ggml_types import GGMLType
from omnistage.layers.quant_paths import FLOAT_KERNEL_BLOCK
from omnistage.layers.quantized_linear import QuantizedLinear

logger = logging.getLogger("omnistage")


def wants_float_kernels(model: nn.Module) -> bool:
    """The model asks for them, and the kernels are built and not disabled."""
    return (
        getattr(model, "float_linears_on_kernels", False)
        and not os.environ.get(DISABLE_ENV)
        and kernels.load_quant() is not None
    )


def _convertible(module: nn.Module) -> bool:
    return (
        isinstance(module, nn.Linear)
        and module.weight.dtype == torch.float32
        and module.weight.device.type == "cpu"
        and module.in_features % FLOAT_KERNEL_BLOCK == 0
    )


def linears_on_float_kernels(model: nn.Module) -> int:
    """Replace `model`'s float32 `Linear`s (outside `keeps_plain_linears` parts) by F32
    `QuantizedLinear`s over the same bytes; returns how many were replaced."""
    own = {
        id(m)
        for part in model.modules()
        if getattr(part, "keeps_plain_linears", False)
        for m in part.modules()
    }
    targets = [
        (parent, name, child)
        for parent in model.modules()
        if id(parent) not in own
        for name, child in parent.named_children()
        if _convertible(child)
    ]
    for parent, name, child in targets:
        weight = child.weight.detach().contiguous()
        kernel = QuantizedLinear(
            weight.view(torch.uint8),
            GGMLType.F32,
            child.in_features,
            child.out_features,
            bias=child.bias,
        )
        setattr(parent, name, kernel)
    if targets:
        logger.info("%d float32 linear layers run on the C kernels", len(targets))
    return len(targets)
