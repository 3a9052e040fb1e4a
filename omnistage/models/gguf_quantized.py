"""GGUF weights kept in the file's quantized blocks, put into a built model.

`LLM(model="x.gguf")` (and the built-in GGUF models) with `dtype="auto"` runs
the linear layers and the token embedding on the file's Q4_0 / Q4_1 / Q8_0 /
Q4_K / Q6_K blocks, and on its F32 / F16 / BF16 matrices as they are stored
(`layers.quantized_linear`), so resident weight memory is about the file's size
and a decode step reads the file's bytes. Everything else (norms, biases, float
matrices whose rows are not a multiple of 32, quantized types the kernels do not
run) loads as floats from the converted checkpoint as before.
An explicit dtype dequantizes everything (exact-equality tests run there).

`read_quantized_weights` reads the blocks (llama q/k rows put back in HF
order: a row's blocks move as a whole); `quantized_groups` decides which
modules of a model take them; `install_quantized` swaps those modules.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from omnistage.layers.quant_paths import FLOAT_KERNEL_BLOCK, FLOAT_KERNEL_TYPES, KERNEL_TYPES
from omnistage.layers.quantized_linear import QuantizedEmbedding, QuantizedLinear
from omnistage.models.gguf_index import read_gguf_index
from omnistage.models.gguf_names import (
    ROPE_PERMUTED_ARCHITECTURES,
    hf_tensor_name,
    rope_heads,
    unpermute_rows,
)

logger = logging.getLogger("omnistage")


@dataclass(frozen=True)
class QuantizedWeight:
    """One GGUF tensor's blocks: `blocks` uint8 [rows, row_bytes] of `ggml_type`."""

    blocks: torch.Tensor
    ggml_type: Any
    rows: int
    cols: int


@dataclass(frozen=True)
class QuantizedGroup:
    """The quantized weights that make up one module's weight (several for a fused one:
    q/k/v, or gate/up), in row order."""

    module_name: str
    hf_names: tuple[str, ...]


def read_quantized_weights(gguf_path: Path, hf_config: Any) -> dict[str, QuantizedWeight]:
    """Every 2-D tensor of the file whose type the C kernels run, by HF name."""
    index = read_gguf_index(gguf_path)
    heads = (hf_config.num_attention_heads, hf_config.num_key_value_heads)
    out = {}
    for t in index.tensors:
        name = hf_tensor_name(t.name)
        if name is None or t.ggml_type not in KERNEL_TYPES or len(t.shape) != 2:
            continue
        if t.ggml_type in FLOAT_KERNEL_TYPES and t.shape[0] % FLOAT_KERNEL_BLOCK:
            continue  # the kernels take float rows in blocks of 32
        blocks = t.data
        n_head = rope_heads(t.name, *heads)
        if index.architecture in ROPE_PERMUTED_ARCHITECTURES and n_head is not None:
            blocks = unpermute_rows(blocks, n_head)
        blocks = torch.from_numpy(np.array(blocks, dtype=np.uint8, order="C"))  # off the map
        out[name] = QuantizedWeight(blocks, t.ggml_type, t.shape[1], t.shape[0])
    return out


def quantized_groups(model: nn.Module, weights: dict[str, QuantizedWeight]) -> list[QuantizedGroup]:
    """The modules of `model` whose whole weight is in `weights`, all parts of one ggml type:
    its `Linear` layers and token embedding. Anything else loads as floats.

    `model.weight_target(hf_name)` names the parameter (and row offset in a fused one) each
    checkpoint tensor loads into; a model without it keeps every weight as floats."""
    target = getattr(model, "weight_target", None)
    if target is None or not weights:
        return []
    modules = dict(model.named_modules())
    parts: dict[str, list[tuple[int, str]]] = {}
    for hf_name in weights:
        mapped = target(hf_name)
        if mapped is None or not mapped[0].endswith(".weight"):
            continue
        param, offset = mapped
        parts.setdefault(param.removesuffix(".weight"), []).append((offset or 0, hf_name))
    groups = []
    for module_name, members in parts.items():
        module = modules.get(module_name)
        members.sort()
        if _covers(module, [weights[n] for _, n in members], [o for o, _ in members]):
            groups.append(QuantizedGroup(module_name, tuple(n for _, n in members)))
    return groups


def _covers(module: nn.Module | None, parts: list[QuantizedWeight], offsets: list[int]) -> bool:
    """The parts fill the module's weight exactly, in order, with one ggml type."""
    if isinstance(module, nn.Embedding):
        rows, cols = module.num_embeddings, module.embedding_dim
    elif isinstance(module, nn.Linear):
        rows, cols = module.out_features, module.in_features
    else:
        return False
    if len({p.ggml_type for p in parts}) != 1 or any(p.cols != cols for p in parts):
        return False
    starts = np.cumsum([0] + [p.rows for p in parts])
    return list(starts[:-1]) == offsets and starts[-1] == rows


def install_quantized(
    model: nn.Module,
    groups: list[QuantizedGroup],
    weights: dict[str, QuantizedWeight],
    activations: str | None = None,
) -> None:
    """Replace each group's module by its quantized form (a `Linear`'s loaded bias is kept;
    an LM head tied to a quantized embedding becomes a linear over the same bytes), its
    products on the `activations` path (`QuantizedLinear`)."""
    tied = getattr(model, "tie_word_embeddings", False)
    for group in groups:
        parts = [weights[n] for n in group.hf_names]
        blocks = torch.cat([p.blocks for p in parts]) if len(parts) > 1 else parts[0].blocks
        parent_name, _, attr = group.module_name.rpartition(".")
        parent = model.get_submodule(parent_name)
        old = getattr(parent, attr)
        if isinstance(old, nn.Embedding):
            new = QuantizedEmbedding(
                blocks, parts[0].ggml_type, old.num_embeddings, old.embedding_dim
            )
            if tied and isinstance(getattr(model, "lm_head", None), nn.Linear):
                model.lm_head = new.as_linear(activations)
        else:
            new = QuantizedLinear(
                blocks,
                parts[0].ggml_type,
                old.in_features,
                old.out_features,
                bias=old.bias,
                activations=activations,
            )
        setattr(parent, attr, new)
    if groups:
        kinds = sorted({weights[g.hf_names[0]].ggml_type.name for g in groups})
        logger.info(
            "%d layers keep the GGUF's quantized weights (%s); dtype='float32' dequantizes",
            len(groups),
            ", ".join(kinds),
        )
