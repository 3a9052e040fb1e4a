"""GGUF files -> cached HF-style checkpoint directories.

A GGUF file (llama.cpp's format) holds quantized weights under llama.cpp
tensor names, the model's hyper-parameters and its tokenizer as metadata. The
engine loads HF checkpoints, so a GGUF file is converted once into a directory

    config.json                  built from the metadata (Llama/Qwen2/Qwen3Config)
    model.safetensors            float32, HF parameter names (sharded if large)
    tokenizer.json, tokenizer_config.json, chat_template.jinja
    omnistage-gguf.json          written last: marks the directory complete, names the
                                 source file and the converter that wrote it

which `gguf_cache` keeps under `$OMNISTAGE_CACHE_DIR` (default
`~/.cache/omnistage`) so later starts read nothing from the GGUF.

`convert_gguf` does the conversion; `read_gguf`,
`gguf_hf_config` and `iter_gguf_weights` are its parts (weights and config
need no tokenizer metadata).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import safetensors.torch
import torch
import transformers
from gguf import GGMLQuantizationType

from omnistage.models.gguf_names import (
    ROPE_FREQS,
    ROPE_PERMUTED_ARCHITECTURES,
    hf_tensor_name,
    rope_heads,
    unpermute_rows,
)

logger = logging.getLogger("omnistage")

_SHARD_BYTES = 2 << 30
"""Largest safetensors file written; bounds memory during conversion."""


@dataclass(frozen=True)
class _Arch:
    """How one GGUF `general.architecture` maps onto transformers."""

    config_class: type[transformers.PretrainedConfig]
    hf_architecture: str
    has_head_dim: bool = True
    """The config class has a `head_dim` field; else it is set only when not hidden / heads."""


_ARCHS: dict[str, _Arch] = {
    "llama": _Arch(transformers.LlamaConfig, "LlamaForCausalLM"),
    "qwen2": _Arch(transformers.Qwen2Config, "Qwen2ForCausalLM", has_head_dim=False),
    "qwen3": _Arch(transformers.Qwen3Config, "Qwen3ForCausalLM"),
}

# -- reading --------------------------------------------------------------------------------


def read_gguf(path: Path) -> gguf.GGUFReader:
    """Open a GGUF file (memory-mapped). ValueError naming the file if it is unreadable."""
    try:
        return gguf.GGUFReader(path)
    except Exception as e:  # the reader fails with whatever numpy raises on bad bytes
        raise ValueError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from e


def _meta(reader: gguf.GGUFReader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _architecture(reader: gguf.GGUFReader) -> tuple[str, _Arch]:
    arch = _meta(reader, "general.architecture")
    if arch not in _ARCHS:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported (supported: {', '.join(_ARCHS)})"
        )
    return arch, _ARCHS[arch]


def _tensor(reader: gguf.GGUFReader, name: str) -> gguf.ReaderTensor | None:
    return next((t for t in reader.tensors if t.name == name), None)


# -- config ---------------------------------------------------------------------------------


def gguf_hf_config(reader: gguf.GGUFReader) -> transformers.PretrainedConfig:
    """The transformers config (Llama/Qwen2/Qwen3Config) described by a GGUF's metadata."""
    arch, spec = _architecture(reader)

    def get(key: str, default=None):
        return _meta(reader, f"{arch}.{key}", default)

    def need(key: str):
        if (value := get(key)) is None:
            raise ValueError(f"GGUF metadata lacks {arch}.{key}")
        return value

    n_head, hidden = need("attention.head_count"), need("embedding_length")
    head_dim = get("attention.key_length") or get("rope.dimension_count") or hidden // n_head
    embed = _tensor(reader, "token_embd.weight")
    if embed is None:
        raise ValueError("GGUF has no token_embd.weight tensor")
    names = {t.name for t in reader.tensors}
    kwargs = dict(
        architectures=[spec.hf_architecture],
        hidden_size=hidden,
        intermediate_size=need("feed_forward_length"),
        num_hidden_layers=need("block_count"),
        num_attention_heads=n_head,
        num_key_value_heads=get("attention.head_count_kv", n_head),
        # GGUF shapes are innermost-first: ne[1] of the embedding is the vocabulary.
        vocab_size=int(embed.shape[1]),
        tie_word_embeddings="output.weight" not in names,
        bos_token_id=_meta(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_meta(reader, "tokenizer.ggml.eos_token_id"),
        pad_token_id=_meta(reader, "tokenizer.ggml.padding_token_id"),
        dtype="float32",
    )
    if spec.has_head_dim or head_dim != hidden // n_head:
        kwargs["head_dim"] = head_dim
    if (context := get("context_length")) is not None:
        kwargs["max_position_embeddings"] = context
    if (eps := get("attention.layer_norm_rms_epsilon")) is not None:
        kwargs["rms_norm_eps"] = _f32(eps)
    if arch in ("llama", "qwen3"):
        kwargs["attention_bias"] = "blk.0.attn_q.bias" in names
    kwargs.update(_rope_kwargs(reader, get, head_dim))
    return spec.config_class(**kwargs)


def _f32(x: float) -> float:
    """The shortest decimal that rounds to the same float32 (GGUF stores 1e-5 as 9.99999975e-06)."""
    return float(str(np.float32(x)))


def _rope_kwargs(reader: gguf.GGUFReader, get, head_dim: int) -> dict:
    """`rope_theta=` or a full `rope_parameters=`; ValueError for scalings we cannot map."""
    theta = _f32(get("rope.freq_base", 10000.0))
    scaling = get("rope.scaling.type", "none")
    if scaling == "linear":
        factor = _f32(get("rope.scaling.factor", 1.0))
        return {"rope_parameters": {"rope_type": "linear", "rope_theta": theta, "factor": factor}}
    if scaling != "none":
        raise ValueError(f"GGUF rope scaling {scaling!r} is not supported")
    freqs = _tensor(reader, ROPE_FREQS)
    if freqs is None:
        return {"rope_theta": theta}
    return {"rope_parameters": _llama3_rope(np.asarray(freqs.data, np.float64), theta, head_dim)}


def _llama3_rope(factors: np.ndarray, theta: float, head_dim: int) -> dict:
    """Recover llama3 rope scaling from the per-frequency factors llama.cpp stores.

    The file keeps only the factors; we accept them if they are exactly what
    Llama 3.1+'s parameters (low 1, high 4, original context 8192, factor = the
    largest) produce, and refuse anything else rather than guess.
    """
    params = {
        "rope_type": "llama3",
        "rope_theta": theta,
        "factor": float(factors.max()),
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    if np.allclose(factors, 1.0):
        return {"rope_type": "default", "rope_theta": theta}
    if not np.allclose(factors, llama3_rope_factors(params, head_dim), rtol=1e-5):
        raise ValueError("GGUF rope_freqs do not match llama3 rope scaling; not supported")
    return params


def llama3_rope_factors(params: dict, head_dim: int) -> np.ndarray:
    """llama.cpp's `rope_freqs` for llama3 rope `params` (as its converter computes them)."""
    inv_freq = 1.0 / params["rope_theta"] ** (np.arange(0, head_dim, 2) / head_dim)
    factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    old = params["original_max_position_embeddings"]
    wavelen = 2 * np.pi / inv_freq
    smooth = (old / wavelen - low) / (high - low)
    mid = 1 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < old / high, 1.0, np.where(wavelen > old / low, factor, mid))


# -- weights --------------------------------------------------------------------------------


def iter_gguf_weights(
    reader: gguf.GGUFReader, config: transformers.PretrainedConfig
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of the file, dequantized to float32, as `(HF name, tensor)`.

    Llama q/k rows are put back in HF order. ValueError for an unknown tensor
    name or a quantization type the gguf package cannot dequantize.
    """
    arch, _ = _architecture(reader)
    heads = (config.num_attention_heads, config.num_key_value_heads)
    for t in reader.tensors:
        if t.name == ROPE_FREQS:
            continue  # folded into config.rope_parameters
        name = hf_tensor_name(t.name)
        if name is None:
            raise ValueError(f"GGUF tensor {t.name!r} has no HF counterpart (unsupported)")
        try:
            w = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError as e:
            qtype = GGMLQuantizationType(t.tensor_type).name
            raise ValueError(f"GGUF tensor {t.name!r}: cannot dequantize {qtype}") from e
        n_head = rope_heads(t.name, *heads)
        if arch in ROPE_PERMUTED_ARCHITECTURES and n_head is not None:
            w = unpermute_rows(w, n_head)
        if not (w.flags.writeable and w.flags.c_contiguous):
            w = np.array(w, order="C")  # F32 data is a read-only view of the mapped file
        yield name, torch.from_numpy(w)


def write_safetensors(weights: Iterable[tuple[str, torch.Tensor]], out_dir: Path) -> list[str]:
    """Write tensors as `model.safetensors`, or as shards plus an index if large.

    Returns the file names written. Only one shard is held in memory at a time.
    """
    shards: list[str] = []
    weight_map: dict[str, int] = {}
    batch: dict[str, torch.Tensor] = {}
    size = total = 0

    def flush() -> None:
        shards.append(f"model-{len(shards) + 1:05d}.safetensors")
        safetensors.torch.save_file(batch, out_dir / shards[-1], metadata={"format": "pt"})
        batch.clear()

    for name, tensor in weights:
        nbytes = tensor.numel() * tensor.element_size()
        if batch and size + nbytes > _SHARD_BYTES:
            flush()
            size = 0
        batch[name] = tensor.contiguous()
        weight_map[name] = len(shards)
        size += nbytes
        total += nbytes
    if batch or not shards:
        flush()
    if len(shards) == 1:
        os.replace(out_dir / shards[0], out_dir / "model.safetensors")
        return ["model.safetensors"]
    final = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for old, new in zip(shards, final, strict=True):
        os.replace(out_dir / old, out_dir / new)
    index = {
        "metadata": {"total_size": total},
        "weight_map": {name: final[i] for name, i in weight_map.items()},
    }
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return [*final, "model.safetensors.index.json"]


# -- conversion and cache -------------------------------------------------------------------


def convert_gguf(gguf_path: Path, out_dir: Path, *, tokenizer: bool = True) -> None:
    """Write config.json, float32 safetensors and (if `tokenizer`) the tokenizer into `out_dir`.

    No caching and no atomicity: see `cached_gguf_checkpoint`. Errors about the
    file's content are ValueError naming the file.
    """
    gguf_path = Path(gguf_path)
    reader = read_gguf(gguf_path)
    try:
        config = gguf_hf_config(reader)
        config.save_pretrained(out_dir)
        write_safetensors(iter_gguf_weights(reader, config), out_dir)
    except ValueError as e:
        raise ValueError(f"{gguf_path}: {e}") from e
    if tokenizer:
        _convert_tokenizer(gguf_path, out_dir)


def _convert_tokenizer(gguf_path: Path, out_dir: Path) -> None:
    try:
        tok = transformers.AutoTokenizer.from_pretrained(
            gguf_path.parent, gguf_file=gguf_path.name, local_files_only=True
        )
    except Exception as e:  # transformers raises many kinds for a bad tokenizer section
        raise ValueError(f"{gguf_path}: cannot build a tokenizer from its metadata ({e})") from e
    tok.save_pretrained(out_dir)
