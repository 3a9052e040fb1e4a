"""What a model family declares: the one record the registry reads from each family folder.

A family (`omnistage/families/<name>/`) owns everything about one kind of
model: its model classes, multimodal input encoder, the processors of its
pipeline edges, its deploy files, the parts of its multi-part checkpoints, the
maker of its tiny random-weight checkpoint and its built-in demo. Its
`__init__.py` holds one `FAMILY = Family(...)` and nothing else; the record
names code as `"module:attribute"` strings, so reading every family's record
imports neither torch nor any model (the server's frontend and the CLI read
it at start-up). `omnistage.models.registry` discovers the records and
imports what a lookup asks for, when it asks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PartSpec:
    """One part (thinker, talker, …) of a multi-part checkpoint, served by an AR model."""

    config_path: tuple[str, ...]
    """Attributes leading from the checkpoint's config to the part's config."""
    architecture: str
    """The omnistage architecture (registry name) that serves the part."""
    renames: tuple[tuple[str, str], ...]
    """(prefix on disk, prefix the architecture expects); other weights are not the part's."""
    eos_token_id: tuple[str, ...] | None = None
    """Attributes leading from the checkpoint's config to the part's own end id, when it
    is not the tokenizer's (a talker ends at its codec's end code)."""


@dataclass(frozen=True)
class Demo:
    """A built-in demo: a tiny random-weight checkpoint made on first use, then cached."""

    description: str
    """One line for humans (`omnistage models`)."""
    maker: str
    """"module:function" taking (path, seed) and writing the checkpoint there."""
    deploy: str
    """The packaged deploy file that serves it."""
    version: int = 1
    """Bumped when the maker changes what it writes (a new cache directory)."""


@dataclass(frozen=True)
class Voices:
    """The named speakers of a talker an edge feeds, and the one used when none is asked."""

    reader: str
    """"module:function" taking the talker checkpoint directory, returning speaker names."""
    default: str | None
    """None: the checkpoint's first speaker (none for a model without named speakers)."""
    clones_uploads: bool = True
    """Whether the talker speaks in voices uploaded to `/v1/audio/voices` (an entry-stage
    TTS talker); False where cloning needs a part the checkpoint lacks."""


@dataclass(frozen=True)
class Family:
    """Everything the rest of omnistage may know about one model family, by name."""

    name: str
    models: Mapping[str, str] = field(default_factory=dict)
    """HF `architectures` name -> "module:Class" of the `CausalLM` serving it (names
    starting with "Omnistage" serve parts of multi-part checkpoints)."""
    parts: Mapping[tuple[str, str], PartSpec] = field(default_factory=dict)
    """(checkpoint `model_type`, part) -> the AR model serving that part."""
    generation_models: Mapping[str, str] = field(default_factory=dict)
    """config.json `architectures` name -> "module:Class" of a `GenerationModel`."""
    generation_parts: Mapping[tuple[str, str], str] = field(default_factory=dict)
    """(checkpoint `model_type`, part) -> "module:Class" of the `GenerationModel` serving
    that part (each has `from_checkpoint(path, hf_config, dtype)`)."""
    input_encoders: Mapping[str, str] = field(default_factory=dict)
    """config.json `model_type` -> "module:Class" of its `OmniInputEncoder`."""
    entry_media: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """config.json `model_type` -> the media ("image") its generation entry stage takes
    itself (`GenerationModel.take_images`; no `OmniInputEncoder`, no chat placeholders)."""
    configs: Mapping[str, str] = field(default_factory=dict)
    """config.json `model_type` -> "module:Class" of its transformers config, for models
    transformers does not know (registered with `AutoConfig` before such a checkpoint is
    read)."""
    stage_prompters: Mapping[Any, str] = field(default_factory=dict)
    """config.json `model_type` (or `(model_type, part)`: that part only) -> "module:Class"
    of a prompter: an entry stage whose model renders its own prompt from the request
    (GLM-Image's prior states the image size, a TTS talker its voice)."""
    diffusion_pipelines: Mapping[str, str] = field(default_factory=dict)
    """model_index.json `_class_name` -> "module:Class" of its `DiffusionModel`."""
    edges: Mapping[str, str] = field(default_factory=dict)
    """Edge processor name (as deploy files write it) -> "module:Class"."""
    voices: Mapping[str, Voices] = field(default_factory=dict)
    """Edge processor name -> the speakers of the talker it feeds; or config.json
    `model_type` -> the speakers of an entry stage that renders its own prompt (a TTS
    talker)."""
    deploys_by_model_type: Mapping[str, str] = field(default_factory=dict)
    """config.json `model_type` -> the packaged deploy `Omni(model=...)` serves it with."""
    deploys_by_pipeline_class: Mapping[str, str] = field(default_factory=dict)
    """model_index.json `_class_name` -> the packaged deploy serving it."""
    demos: Mapping[str, Demo] = field(default_factory=dict)
    """Built-in demo name -> how to make it."""
    layouts: Mapping[str, str] = field(default_factory=dict)
    """A file naming a checkpoint folder in a family's own layout (not HF's: no
    config.json) -> "module:function" `(folder, out)` writing its HF view into `out`
    (converted once, kept in the cache directory; `models/layout_cache.py`)."""
    architecture_layouts: Mapping[str, str] = field(default_factory=dict)
    """config.json `architectures` name -> a converter like `layouts`', for checkpoints
    published with another family's `model_type` (MiMo-Audio's `qwen2`); a config.json
    whose `model_type` is a family's own (`configs`) is already a view."""
