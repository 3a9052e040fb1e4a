"""The one registry of model families: what serves an architecture, a part, an edge, a demo.

It discovers the folders of `omnistage/families/` (each declares one `FAMILY`,
`omnistage.models.family`), checks that no two claim the same name, and
answers every "which code serves this?" question of the rest of omnistage by
importing the code a family names only when it is asked for. Reading the
records imports neither torch nor a model, so frontends may ask at start-up.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnistage.models.family import Demo, Family, PartSpec, Voices

FAMILIES_PACKAGE = "omnistage.families"
DEPLOYS_FOLDER = "deploys"

_EXTRA_MODELS: dict[str, type] = {}
"""Model classes registered at run time (`register_model`: tests, plugins)."""


TABLES = tuple(f.name for f in dataclasses.fields(Family) if f.name != "name")
"""The fields of a family's record that map a name to what serves it."""


@dataclass(frozen=True)
class _Discovered:
    families: tuple[tuple[Family, Path], ...]
    """Each family's record and its folder, by folder name."""
    tables: dict[str, dict[Any, Any]]
    """Per record field, every family's entries merged (no key is claimed twice)."""


@functools.cache
def _discovered() -> _Discovered:
    package = importlib.import_module(FAMILIES_PACKAGE)
    found = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if not info.ispkg:
            continue
        module = importlib.import_module(f"{FAMILIES_PACKAGE}.{info.name}")
        family = getattr(module, "FAMILY", None)
        if not isinstance(family, Family):
            raise TypeError(f"{module.__name__} declares no FAMILY = Family(...)")
        found.append((family, Path(module.__file__).parent))
    return _Discovered(tuple(found), _merge([f for f, _ in found]))


def _merge(families: list[Family]) -> dict[str, dict[Any, Any]]:
    """Each table of every family merged; TypeError when two families claim the same
    architecture, part, edge, demo, …"""
    tables: dict[str, dict[Any, Any]] = {table: {} for table in TABLES}
    owners: dict[tuple[str, Any], str] = {}
    for family in families:
        for table in TABLES:
            for key, value in getattr(family, table).items():
                other = owners.setdefault((table, key), family.name)
                if other != family.name:
                    raise TypeError(f"{table} {key!r} is claimed by {other} and {family.name}")
                tables[table][key] = value
    return tables


def families() -> tuple[Family, ...]:
    """Every family, by folder name."""
    return tuple(f for f, _ in _discovered().families)


def _merged(table: str) -> dict[Any, Any]:
    return _discovered().tables[table]


def resolve(reference: str) -> Any:
    """The object a "module:attribute" reference names (imported now)."""
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _resolved(field: str, key: Any) -> Any:
    reference = _merged(field).get(key)
    return None if reference is None else resolve(reference)


# --- autoregressive models ---------------------------------------------------------------


def register_model(cls: type) -> type:
    """Serve `cls.architectures` with `cls` (tests and plugins; families declare theirs)."""
    for arch in cls.architectures:
        _EXTRA_MODELS[arch] = cls
    return cls


def supported_architectures() -> list[str]:
    """HF `architectures` names (internal ones, for parts of omni checkpoints, left out)."""
    names = {*_merged("models"), *_EXTRA_MODELS}
    return sorted(a for a in names if not a.startswith("Omnistage"))


def model_class_for(hf_config: Any) -> type:
    """The `CausalLM` class serving this config's `architectures`; ValueError listing the
    supported ones."""
    archs = list(getattr(hf_config, "architectures", None) or [])
    models = _merged("models")
    for arch in archs:
        if arch in _EXTRA_MODELS:
            return _EXTRA_MODELS[arch]
        if arch in models:
            return resolve(models[arch])
    raise ValueError(
        f"architectures: {archs or 'none given'} is not supported; "
        f"supported: {', '.join(supported_architectures())}"
    )


def engine_config(hf_config: Any) -> Any:
    """The config an engine serves `hf_config`'s checkpoint with: the checkpoint's own, or,
    for a composite checkpoint whose decoder is one of its sub-configs (GLM-Image's prior:
    `text_config`), the view its model class's `engine_config_for` gives."""
    view = getattr(model_class_for(hf_config), "engine_config_for", None)
    return hf_config if view is None else view(hf_config)


def part_spec(model_type: str, part: str) -> PartSpec | None:
    """How the AR model serving `part` of a `model_type` checkpoint reads it."""
    return _merged("parts").get((model_type, part))


def part_names(model_type: str) -> list[str]:
    """The AR parts of a `model_type` checkpoint (empty for single-part models)."""
    return sorted(part for (mt, part) in _merged("parts") if mt == model_type)


def register_configs() -> None:
    """Register every family's own transformers config (`Family.configs`) with
    `AutoConfig`, so `AutoConfig.from_pretrained` reads checkpoints transformers does not
    know; idempotent."""
    from transformers import AutoConfig

    for model_type in _merged("configs"):
        AutoConfig.register(model_type, _resolved("configs", model_type), exist_ok=True)


def auto_config(path: Path) -> Any:
    """transformers' config of the checkpoint directory `path` (offline), family configs
    included."""
    from transformers import AutoConfig

    register_configs()
    return AutoConfig.from_pretrained(path, local_files_only=True)


def auto_config_and_tokenizer(path: Path, what: str) -> tuple[Any, Any]:
    """The checkpoint's config (`auto_config`) and tokenizer, offline; ValueError naming
    `what` (a family's name) when either does not load."""
    from transformers import AutoTokenizer

    try:
        return auto_config(path), AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: cannot load {what}'s config and tokenizer ({e})") from e


def _prompter_key(model_type: str | None, part: str | None) -> Any:
    """`(model_type, part)` where a family declares a prompter for that part alone (Ming-Omni's
    talker, whose checkpoint's thinker takes a chat), else `model_type`."""
    table = _merged("stage_prompters")
    return (model_type, part) if (model_type, part) in table else model_type


def renders_own_prompt(model_type: str | None, part: str | None = None) -> bool:
    """Whether a `model_type` model (its `part`) renders its own prompt from a request (no
    import)."""
    return _prompter_key(model_type, part) in _merged("stage_prompters")


def stage_prompter_class(model_type: str | None, part: str | None = None) -> type | None:
    """The prompter of a model (its `part`) that renders its own prompt from a request, or
    None."""
    return _resolved("stage_prompters", _prompter_key(model_type, part))


# --- generation, encoders, diffusion --------------------------------------------------------


def layout_converter(path: Path) -> Any:
    """The converter of a checkpoint folder in a family's own layout (`Family.layouts`),
    or None for an HF-layout folder."""
    if (path / "config.json").is_file():
        return _architecture_layout(path / "config.json")
    marker = next((m for m in sorted(_merged("layouts")) if (path / m).is_file()), None)
    return None if marker is None else _resolved("layouts", marker)


def _architecture_layout(config_file: Path) -> Any:
    """The converter of an HF folder whose config.json names a family's architecture under
    a `model_type` no family owns (`Family.architecture_layouts`), or None."""
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or config.get("model_type") in _merged("configs"):
        return None
    layouts = _merged("architecture_layouts")
    arch = next((a for a in config.get("architectures") or () if a in layouts), None)
    return None if arch is None else _resolved("architecture_layouts", arch)


def layout_architectures() -> list[str]:
    """The architectures a family claims under another `model_type` (`omnistage models`)."""
    return sorted(_merged("architecture_layouts"))


def generation_model_class(architectures: list[str]) -> type | None:
    models = _merged("generation_models")
    return next((resolve(models[a]) for a in architectures if a in models), None)


def generation_architectures() -> list[str]:
    return sorted(_merged("generation_models"))


def generation_part_class(model_type: str, part: str) -> type | None:
    return _resolved("generation_parts", (model_type, part))


def generation_part_names(model_type: str) -> list[str]:
    return sorted(part for (mt, part) in _merged("generation_parts") if mt == model_type)


def input_encoder_class(model_type: str | None) -> type | None:
    """The `OmniInputEncoder` of a `model_type`, or None for text-only models."""
    return _resolved("input_encoders", model_type)


def entry_media(model_type: str | None) -> frozenset[str]:
    """The media a generation entry model of `model_type` takes itself (`Family.entry_media`)."""
    return frozenset(_merged("entry_media").get(model_type, ()))


def input_encoder_model_types() -> list[str]:
    return sorted(_merged("input_encoders"))


def diffusion_model_class(pipeline_class: str | None) -> type | None:
    """The `DiffusionModel` serving a model_index.json `_class_name`, or None."""
    return _resolved("diffusion_pipelines", pipeline_class)


def diffusion_pipeline_names() -> list[str]:
    return sorted(_merged("diffusion_pipelines"))


# --- edges and voices ----------------------------------------------------------------------


def edge_names() -> list[str]:
    return sorted(_merged("edges"))


def edge_class(name: str) -> type | None:
    return _resolved("edges", name)


def edge_voices(name: str) -> tuple[Callable[[Path], list[str]], str | None] | None:
    """(speaker reader, default voice) of the talker an edge processor feeds (or of an
    entry-stage talker, by its model type), or None."""
    voices: Voices | None = _merged("voices").get(name)
    return None if voices is None else (resolve(voices.reader), voices.default)


def clones_uploaded_voices(name: str) -> bool:
    """Whether the talker declared under `name` speaks in uploaded voices."""
    voices: Voices | None = _merged("voices").get(name)
    return voices is not None and voices.clones_uploads


# --- deploys and demos ---------------------------------------------------------------------


def packaged_deploys() -> dict[str, Path]:
    """Deploy name -> its file, from every family's `deploys/` folder."""
    return {
        path.stem: path
        for _, folder in _discovered().families
        for path in sorted((folder / DEPLOYS_FOLDER).glob("*.yaml"))
    }


def deploy_for_model_type(model_type: str | None) -> str | None:
    """The packaged deploy `Omni(model=...)` serves a `model_type` checkpoint with."""
    return _merged("deploys_by_model_type").get(model_type)


def deploys_by_model_type() -> Mapping[str, str]:
    return dict(_merged("deploys_by_model_type"))


def deploy_for_pipeline_class(pipeline_class: str | None) -> str | None:
    """The packaged deploy serving a diffusers-layout checkpoint, by its `_class_name`."""
    return _merged("deploys_by_pipeline_class").get(pipeline_class)


def demos() -> dict[str, Demo]:
    """Built-in demo name -> how to make it."""
    return dict(_merged("demos"))
