"""Parts of one multi-part checkpoint (thinker, talker, code2wav saved together).

Omni checkpoints keep every part in one directory: one config.json with a
sub-config per part, one set of safetensors with the weights prefixed per part
(`thinker.model.layers.0…`, `talker.…`, `code2wav.…`). A stage that runs one
part names it (`model_part` in the deploy file or the engine arguments);
the part's family declares it (`Family.parts`);
`select_part` returns that part's config, marked with the architecture that
serves it here and how its weight names map onto that architecture's.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from omnistage.models import registry

RENAMES_ATTR = "omnistage_weight_renames"
ROOT_CONFIG_ATTR = "omnistage_root_config"
"""The whole checkpoint's config, on a part's config (parts read their siblings' settings)."""


def select_part(hf_config: Any, part: str) -> Any:
    """The config of `part`, carrying its architecture and weight renames; ValueError if the
    checkpoint has no such part."""
    model_type = getattr(hf_config, "model_type", "?")
    spec = registry.part_spec(model_type, part)
    if spec is None:
        known = registry.part_names(model_type)
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
