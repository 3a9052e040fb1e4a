"""From what the user names as a model to its files: config, weights, tokenizer.

`resolve_model` accepts a built-in name (`builtin.py`), an HF-style checkpoint
directory, or a `.gguf` file (converted once into a cached HF-style directory
by `gguf_loader.py`). Whatever the input, the result is a directory holding
config.json, *.safetensors and the tokenizer files, so everything downstream
reads one format, by HF parameter names. Nothing here touches the network.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omnistage.models.builtin import (
    builtin_gguf_path,
    builtin_model,
    builtin_models,
    demo_deploy,
    demo_model_path,
)
from omnistage.models.gguf_cache import cached_gguf_checkpoint

if TYPE_CHECKING:  # imported where used: resolving a model must not cost their import
    import torch
    import transformers

_INDEX = "model.safetensors.index.json"


class _MropeKeysFilter(logging.Filter):
    """transformers' rope validation warns that the multimodal-rope keys of Qwen-Omni
    configs (`mrope_section`, `interleaved`, ...) are unknown to the 'default' rope type
    each time such a config is built; they are read by the models that use them."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (
            message.startswith("Unrecognized keys in `rope_parameters`") and "mrope" in message
        )


logging.getLogger("transformers.modeling_rope_utils").addFilter(_MropeKeysFilter())


@dataclass(frozen=True)
class ModelFiles:
    """A model resolved to an HF-style checkpoint directory."""

    name: str
    """What the user gave: a built-in name, a directory or a .gguf path."""
    path: Path
    """Directory with config.json, *.safetensors and the tokenizer files (+ chat template)."""
    source: str
    """Where the files came from, for humans (logs, `omnistage models`)."""
    gguf: Path | None = None
    """The GGUF file the directory was converted from (its quantized weights can be loaded
    as they are, see `gguf_quantized`); None for other checkpoints."""


def resolve_model(model: str) -> ModelFiles:
    """Resolve a built-in name, a checkpoint directory or a .gguf file to its files.

    A GGUF (built-in or given) is converted on first use into a cache directory
    and found there afterwards. ValueError says what is wrong with `model`.
    """
    if not isinstance(model, str) or not model:
        raise ValueError(f"model: expected a built-in name or a path, got {model!r}")
    if demo_deploy(model) is not None:
        path = demo_model_path(model)
        return ModelFiles(model, path, f"built-in {model}: {builtin_models()[model]} ({path})")
    if model in builtin_models():
        gguf_path = builtin_gguf_path(model)
        path = cached_gguf_checkpoint(gguf_path)
        source = (
            f"built-in {model}: {builtin_models()[model]} from package {builtin_model(model).package} "
            f"({gguf_path}), converted cache at {path}"
        )
        return ModelFiles(model, path, source, gguf=gguf_path.resolve())
    given = Path(model).expanduser()
    if given.is_dir():
        from omnistage.models import registry

        converter = registry.layout_converter(given)
        if converter is not None:
            from omnistage.models.layout_cache import cached_layout_view

            path = cached_layout_view(given, converter)
            return ModelFiles(model, path, f"checkpoint {given.absolute()}, HF view at {path}")
        _check_checkpoint_dir(given)
        path = given.absolute()
        return ModelFiles(model, path, f"HF checkpoint directory {path}")
    if given.is_file():
        if given.suffix.lower() != ".gguf":
            raise ValueError(
                f"model: {model!r} is a file but not a .gguf file; give a .gguf file or a "
                "checkpoint directory"
            )
        path = cached_gguf_checkpoint(given)
        return ModelFiles(
            model,
            path,
            f"GGUF file {given.resolve()}, converted cache at {path}",
            gguf=given.resolve(),
        )
    builtins = ", ".join(sorted(builtin_models()))
    raise ValueError(
        f"model: {model!r} is neither a built-in model ({builtins}) nor an existing path"
    )


def _check_checkpoint_dir(path: Path) -> None:
    if (path / "model_index.json").is_file():
        return  # a diffusers-layout checkpoint: its components are checked when loaded
    missing = []
    if not (path / "config.json").is_file():
        missing.append("config.json")
    if not any(path.glob("*.safetensors")):
        missing.append("*.safetensors weights")
    if missing:
        raise ValueError(
            f"model: directory {str(path)!r} is not an HF checkpoint: it has no "
            f"{' and no '.join(missing)}"
        )


def load_hf_config(files: ModelFiles) -> Any:
    """The checkpoint's config (local files only): transformers' config, or its values as
    a `PlainConfig` for model classes that read nothing else (`plain_config`: no
    transformers import once cached)."""
    from omnistage.models.plain_config import load_config

    return load_config(Path(files.path))


def load_tokenizer(files: ModelFiles) -> transformers.PreTrainedTokenizerBase:
    """The tokenizer of the checkpoint, with its chat template (local files only).

    A part of a diffusers-layout checkpoint without tokenizer files of its own (GLM-Image's
    `vision_language_encoder/`) uses its sibling `processor/` folder's."""
    import transformers

    path = Path(files.path)
    sibling = path.parent / "processor"
    if (
        not any(path.glob("tokenizer*"))
        and (path.parent / "model_index.json").is_file()
        and sibling.is_dir()
    ):
        path = sibling
    from omnistage.models import registry

    registry.register_configs()  # AutoTokenizer reads config.json: a family's model_type too
    try:
        return transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: cannot load the tokenizer ({e})") from e


def load_frontend_tokenizer(files: ModelFiles) -> Any:
    """The tokenizer a text frontend encodes, decodes and renders chats with: a
    `TextTokenizer` (no transformers import) for a plain fast tokenizer, else
    `load_tokenizer`'s."""
    from omnistage.models.text_tokenizer import load_text_tokenizer

    return load_text_tokenizer(Path(files.path)) or load_tokenizer(files)


def safetensors_files(path: Path) -> list[Path]:
    """The weight files of a checkpoint directory: from the index if there is one, else all."""
    path = Path(path)
    index = path / _INDEX
    if not index.is_file():
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise ValueError(f"{path}: no *.safetensors files")
        return files
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        names = list(dict.fromkeys(weight_map.values()))  # unique, in index order
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{index}: not a valid safetensors index ({e})") from e
    files = [path / name for name in names]
    for file in files:
        if not file.is_file():
            raise ValueError(f"{file}: listed in {index.name} but missing")
    return files


def iter_weights(
    path: Path, prefixes: Sequence[str] | None = None, skip: Collection[str] = ()
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of every safetensors file of a checkpoint, as `(HF name, tensor)`;
    with `prefixes`, only those whose names start with one (other tensors, and shards
    the index says hold none of them, are never read).

    Tensors are read lazily, one at a time; those named in `skip` are never read. A corrupt or truncated file is a
    ValueError naming it.
    """
    import safetensors

    files = safetensors_files(path)
    index = path / _INDEX
    if prefixes is not None and index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        wanted = {f for name, f in weight_map.items() if name.startswith(tuple(prefixes))}
        files = [f for f in files if f.name in wanted]
    for file in files:
        try:
            handle = safetensors.safe_open(file, framework="pt")
        except (safetensors.SafetensorError, OSError) as e:
            raise ValueError(f"{file}: corrupt or truncated safetensors file ({e})") from e
        with handle as f:
            for key in f.keys():  # noqa: SIM118 (a safe_open handle is not a dict)
                if key in skip or (prefixes is not None and not key.startswith(tuple(prefixes))):
                    continue
                try:
                    tensor = f.get_tensor(key)
                except (safetensors.SafetensorError, OSError, RuntimeError) as e:
                    raise ValueError(f"{file}: cannot read tensor {key!r} ({e})") from e
                yield key, tensor
