"""A checkpoint's config as plain values, read without importing transformers.

Importing transformers and building a config with `AutoConfig` costs ~1.8 s, in
the frontend and again in a worker process, on every start. For checkpoints
whose model class reads its config only as attributes
(`CausalLM.reads_plain_config`)
and whose config has no sub-configs, the first load goes through transformers
once and stores the resolved values (`to_dict()`: every default filled in,
`rope_parameters` standardized) with the config class's attribute aliases under
the cache dir, keyed by the SHA-256 of config.json and the transformers version;
every load, the first included, then returns a `PlainConfig` of those values, so
the first start and later ones serve the model from the same object kind.

The file is written to a temporary name and renamed, so concurrent starts and a
start killed mid-write never leave a half-written entry; an unreadable entry is
rebuilt.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from omnistage.cache import cache_root

_FORMAT = 1
"""Bumped when what an entry holds changes, so old entries are not read as new ones."""


_INTERNAL = frozenset({"_aliases", "_dtype_name"})


class PlainConfig:
    """A flat model config: its values as attributes (and `attribute_map` aliases, as
    transformers resolves them)."""

    def __init__(self, values: dict[str, Any], aliases: dict[str, str]) -> None:
        self.__dict__.update(values)
        if isinstance(values.get("id2label"), dict):  # JSON keys are strings; transformers'
            self.__dict__["id2label"] = {int(k): v for k, v in values["id2label"].items()}
        if isinstance(values.get("dtype"), str):  # a torch.dtype when read (as transformers')
            object.__setattr__(self, "_dtype_name", self.__dict__.pop("dtype"))
        object.__setattr__(self, "_aliases", dict(aliases))

    def __getattr__(self, name: str) -> Any:  # only reached for names not set
        if name == "dtype" and "_dtype_name" in self.__dict__:
            import torch  # only when read: reading a config must not import torch

            self.__dict__["dtype"] = getattr(torch, self.__dict__["_dtype_name"])
            return self.__dict__["dtype"]
        target = self.__dict__.get("_aliases", {}).get(name)
        if target is not None and target in self.__dict__:
            return self.__dict__[target]
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def get_text_config(self, *args: Any, **kwargs: Any) -> PlainConfig:
        """A flat config is its own text config (as transformers answers)."""
        return self

    def to_dict(self) -> dict[str, Any]:
        """The values as transformers' `to_dict` gives them (`dtype` by name)."""
        values = {k: v for k, v in self.__dict__.items() if k not in _INTERNAL}
        if "_dtype_name" in self.__dict__:
            values["dtype"] = self.__dict__["_dtype_name"]
        return values

    def __repr__(self) -> str:
        return f"PlainConfig({self.__dict__.get('model_type')!r}, {len(self.to_dict())} values)"


def load_config(directory: Path) -> Any:
    """The config of the checkpoint in `directory`: a `PlainConfig` where its model class
    allows one (from the cache after the first load), else transformers' config."""
    raw = (directory / "config.json").read_bytes()
    entry = _entry_path(raw)
    cached = _read_entry(entry)
    if cached is not None:
        return cached
    config = _transformers_config(directory)
    values = _plain_values(config)
    if values is None:
        return config
    _write_entry(entry, {"format": _FORMAT, "values": values, "aliases": config.attribute_map})
    return PlainConfig(values, config.attribute_map)


def _transformers_config(directory: Path) -> Any:
    from omnistage.models.registry import auto_config

    try:
        return auto_config(directory)
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"{directory / 'config.json'}: cannot load the config ({e})") from e


def _plain_values(config: Any) -> dict[str, Any] | None:
    """`config`'s values if a `PlainConfig` of them serves its model class, else None."""
    from omnistage.models.registry import model_class_for

    try:
        if not model_class_for(config).reads_plain_config(config):
            return None
    except ValueError:
        return None  # no class serves it: the caller's own error names the architecture
    values = config.to_dict()
    if any(isinstance(v, dict) and "model_type" in v for v in values.values()):
        return None  # sub-configs: parts are selected from transformers objects
    try:
        plain = json.loads(json.dumps(values))
    except (TypeError, ValueError):
        return None
    return plain if PlainConfig(plain, {}).to_dict() == values else None  # nothing lost


def _entry_path(raw: bytes) -> Path:
    version = importlib.metadata.version("transformers")
    digest = hashlib.sha256(raw + f"\0{version}\0{_FORMAT}".encode()).hexdigest()[:32]
    return cache_root() / "configs" / f"{digest}.json"


def _read_entry(path: Path) -> PlainConfig | None:
    try:
        entry = json.loads(path.read_text())
        if entry.get("format") != _FORMAT:
            return None
        return PlainConfig(entry["values"], entry["aliases"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # absent, or unreadable: rebuilt from config.json


def _write_entry(path: Path, entry: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    except OSError:
        return  # a read-only cache only costs the next start transformers' import
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f)
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
