"""Reading an omni checkpoint for its input encoder: the config (`load_config`), the
processors' configs (`processor_configs`), the encoders' weights (`read_weights`), frozen
transformers modules built with exactly those weights (`build_module`), and all of them
together for one encoder class (`load_checkpoint_parts`, what
`OmniInputEncoder.from_checkpoint` builds its encoder from).

transformers and the model loader are imported inside the functions: importing this
module stays cheap.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from omnistage.multimodal.modalities import check_modalities


def load_config(config_or_path: Any) -> Any:
    """A transformers config, or the one of a checkpoint directory (ValueError if none)."""
    if isinstance(config_or_path, (str, os.PathLike)):
        from omnistage.models.registry import auto_config

        try:
            return auto_config(Path(config_or_path))
        except (OSError, ValueError, KeyError) as e:
            raise ValueError(f"{config_or_path}: cannot load the config ({e})") from e
    return config_or_path


def processor_configs(path: Path) -> tuple[dict | None, dict | None]:
    """(feature-extractor config, image-processor config) of a checkpoint directory.

    transformers 5 writes `processor_config.json` with one entry per sub-processor; older
    checkpoints (the Hub's Qwen3-Omni) keep a flat `preprocessor_config.json` holding both.
    """
    feature, image = None, None
    nested = path / "processor_config.json"
    if nested.is_file():
        try:
            data = json.loads(nested.read_text())
        except ValueError as e:
            raise ValueError(f"{nested}: not valid JSON ({e})") from e
        if isinstance(data.get("feature_extractor"), dict):
            feature = data["feature_extractor"]
        if isinstance(data.get("image_processor"), dict):
            image = data["image_processor"]
    flat = path / "preprocessor_config.json"
    if (feature is None or image is None) and flat.is_file():
        try:
            data = json.loads(flat.read_text())
        except ValueError as e:
            raise ValueError(f"{flat}: not valid JSON ({e})") from e
        if feature is None and "feature_extractor_type" in data:
            feature = data
        if image is None and ("image_processor_type" in data or "patch_size" in data):
            image = data
    return feature, image


def read_weights(path: Path, prefixes: Sequence[str]) -> dict[str, dict[str, torch.Tensor]]:
    """`{prefix: {name without prefix: tensor}}` for the checkpoint's tensors under `prefixes`."""
    from omnistage.models.loader import iter_weights

    out: dict[str, dict[str, torch.Tensor]] = {p: {} for p in prefixes}
    for key, tensor in iter_weights(path, prefixes):
        prefix = next(p for p in prefixes if key.startswith(p))
        out[prefix][key[len(prefix) :]] = tensor
    return out


def build_module(cls: Any, config: Any, weights: dict[str, torch.Tensor], dtype, device, what):
    """A transformers module of `cls` from `config` with exactly `weights`, frozen."""
    from transformers.initialization import no_init_weights

    if not weights:
        raise ValueError(f"checkpoint: no {what} weights")
    with no_init_weights():
        module = cls._from_config(copy.deepcopy(config), dtype=dtype)
    try:
        module.load_state_dict(weights, strict=True)
    except RuntimeError as e:
        raise ValueError(f"checkpoint: {what} weights do not fit the config ({e})") from e
    return module.to(device=device, dtype=dtype).eval().requires_grad_(False)


def as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, str):
        resolved = getattr(torch, dtype, None)
        if not isinstance(resolved, torch.dtype):
            raise ValueError(f"dtype: unknown dtype {dtype!r}")
        return resolved
    return dtype


@dataclass
class CheckpointParts:
    """What an `OmniInputEncoder` is built from, as `load_checkpoint_parts` read it."""

    hf_config: Any
    tokenizer: Any
    embed_tokens: torch.Tensor | Callable[[torch.Tensor], torch.Tensor] | None
    """The given embedding (table or function), else the thinker's `embed_tokens` table."""
    dtype: torch.dtype
    audio_tower: torch.nn.Module | None = None
    visual: torch.nn.Module | None = None
    feature_extractor: Any = None
    image_processor: Any = None


def load_checkpoint_parts(
    encoder_cls: Any,
    path: str | os.PathLike,
    dtype: torch.dtype | str,
    *,
    device: str | torch.device,
    modalities: Iterable[str] | None,
    embed_tokens: torch.Tensor | Callable[[torch.Tensor], torch.Tensor] | None,
) -> CheckpointParts:
    """The config, tokenizer, processors and encoders of `modalities` (default: every one the
    checkpoint supports) and (unless `embed_tokens` is given) the thinker's `embed_tokens`
    weight from a checkpoint of `encoder_cls`'s model (an `OmniInputEncoder` subclass)."""
    from transformers import WhisperFeatureExtractor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    from omnistage.models.loader import load_hf_config, load_tokenizer, resolve_model

    dtype = as_dtype(dtype)
    files = resolve_model(os.fspath(path))
    hf_config = load_hf_config(files)
    if getattr(hf_config, "model_type", None) != encoder_cls.model_type:
        raise ValueError(
            f"{files.path}: not a {encoder_cls.model_name} checkpoint "
            f"(model_type {getattr(hf_config, 'model_type', None)!r})"
        )
    supported = encoder_cls.supported_modalities(hf_config)
    wanted = set(supported if modalities is None else modalities)
    check_modalities(supported, wanted)
    audio_cls, vision_cls = encoder_cls.encoder_classes()
    tokenizer = load_tokenizer(files)
    fe_config, ip_config = processor_configs(files.path)
    weights = read_weights(files.path, _weight_prefixes(wanted, embed_tokens is None))
    tc = hf_config.thinker_config
    parts = CheckpointParts(hf_config, tokenizer, embed_tokens, dtype)
    if "audio" in wanted:
        _require(fe_config, files.path, "feature-extractor", "audio")
        parts.feature_extractor = WhisperFeatureExtractor.from_dict(dict(fe_config))
        parts.audio_tower = build_module(
            audio_cls,
            tc.audio_config,
            weights["thinker.audio_tower."],
            dtype,
            device,
            "audio tower (thinker.audio_tower.*)",
        )
    if "image" in wanted:
        _require(ip_config, files.path, "image-processor", "image")
        parts.image_processor = Qwen2VLImageProcessorPil.from_dict(dict(ip_config))
        parts.visual = build_module(
            vision_cls,
            tc.vision_config,
            weights["thinker.visual."],
            dtype,
            device,
            "vision encoder (thinker.visual.*)",
        )
    if embed_tokens is None:
        table = weights["thinker.model.embed_tokens."].get("weight")
        if table is None:
            raise ValueError("checkpoint: no thinker.model.embed_tokens.weight")
        parts.embed_tokens = table.to(device=device, dtype=dtype)
    return parts


def _weight_prefixes(wanted: set[str], with_embed_tokens: bool) -> list[str]:
    """The checkpoint prefixes of the encoders of `wanted` (and of `embed_tokens`)."""
    prefixes = []
    if "audio" in wanted:
        prefixes.append("thinker.audio_tower.")
    if "image" in wanted:
        prefixes.append("thinker.visual.")
    if with_embed_tokens:
        prefixes.append("thinker.model.embed_tokens.")
    return prefixes


def _require(processor_config: dict | None, path: Path, what: str, modality: str) -> None:
    """ValueError when the checkpoint has no `what` config for `modality` input."""
    if processor_config is None:
        raise ValueError(
            f"{path}: no {what} config (processor_config.json or "
            f"preprocessor_config.json) for {modality} input"
        )
