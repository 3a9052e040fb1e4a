"""Parts of one multi-part checkpoint (thinker, talker, code2wav saved together).

Omni checkpoints keep every part in one directory: one config.json with a
sub-config per part, one set of safetensors with the weights prefixed per part
(`thinker.model.layers.0…`, `talker.…`, `code2wav.…`). A stage that runs one
part names it (`model_part` in the deploy file or the engine arguments);
`select_part` returns that part's config, marked with the architecture that
serves it here and how its weight names map onto that architecture's.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class PartSpec:
    config_path: tuple[str, ...]
    """Attributes leading from the checkpoint's config to the part's config."""
    architecture: str
    """The omnistage architecture (registry name) that serves the part."""
    renames: tuple[tuple[str, str], ...]
    """(prefix on disk, prefix the architecture expects); other weights are not the part's."""
    eos_token_id: tuple[str, ...] | None = None
    """Attributes leading from the checkpoint's config to the part's own end id, when it
    is not the tokenizer's (a talker ends at its codec's end code)."""


PARTS: dict[tuple[str, str], PartSpec] = {
    ("qwen3_omni_moe", "thinker"): PartSpec(
        ("thinker_config", "text_config"),
        "OmnistageQwen3OmniThinker",
        (("thinker.model.", "model."), ("thinker.lm_head.", "lm_head.")),
    ),
    ("qwen3_omni_moe", "talker"): PartSpec(
        ("talker_config", "text_config"),
        "OmnistageQwen3OmniTalker",
        (
            ("talker.model.codec_embedding.", "model.embed_tokens."),
            ("talker.model.", "model."),
            ("talker.codec_head.", "lm_head."),
            ("talker.code_predictor.", "code_predictor."),
        ),
        eos_token_id=("talker_config", "codec_eos_token_id"),
    ),
    ("qwen2_5_omni", "thinker"): PartSpec(
        ("thinker_config", "text_config"),
        "OmnistageQwen25OmniThinker",
        (("thinker.model.", "model."), ("thinker.lm_head.", "lm_head.")),
    ),
    ("qwen2_5_omni", "talker"): PartSpec(
        ("talker_config",),
        "OmnistageQwen25OmniTalker",
        (
            ("talker.thinker_to_talker_proj.", "model.thinker_to_talker_proj."),
            ("talker.model.", "model."),
            ("talker.codec_head.", "lm_head."),
        ),
        # transformers also ends at tts_codec_pad (generate's eos [8292, 8294]); see
        # models/qwen25_omni_talker.py.
        eos_token_id=("talker_config", "tts_codec_end_token_id"),
    ),
}

RENAMES_ATTR = "omnistage_weight_renames"
ROOT_CONFIG_ATTR = "omnistage_root_config"
"""The whole checkpoint's config, on a part's config (parts read their siblings' settings)."""


def part_names(model_type: str) -> list[str]:
    return sorted(part for (mt, part) in PARTS if mt == model_type)


def select_part(hf_config: Any, part: str) -> Any:
    """The config of `part`, carrying its architecture and weight renames; ValueError if the
    checkpoint has no such part."""
    model_type = getattr(hf_config, "model_type", "?")
    spec = PARTS.get((model_type, part))
    if spec is None:
        known = part_names(model_type)
        raise ValueError(
            f"model_part: {model_type!r} checkpoints have no part {part!r}; "
            f"known: {', '.join(known) if known else 'none (a single-part model)'}"
        )
    config = hf_config
    for attr in spec.config_path:
        config = getattr(config, attr)
    config = copy.deepcopy(config)
    config.architectures = [spec.architecture]
    setattr(config, RENAMES_ATTR, spec.renames)
    setattr(config, ROOT_CONFIG_ATTR, hf_config)
    if spec.eos_token_id is not None:
        eos = hf_config
        for attr in spec.eos_token_id:
            eos = getattr(eos, attr)
        config.eos_token_id = eos
    return config


def part_weights(
    weights: Iterable[tuple[str, torch.Tensor]], hf_config: Any
) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights of the part `hf_config` describes, renamed; all of them for whole models."""
    renames = getattr(hf_config, RENAMES_ATTR, None)
    if renames is None:
        yield from weights
        return
    for name, tensor in weights:
        for disk, ours in renames:
            if name.startswith(disk):
                yield ours + name[len(disk) :], tensor
                break
