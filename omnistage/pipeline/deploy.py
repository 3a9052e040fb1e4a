"""Deploy files: the YAML description of a multi-stage pipeline, loaded and validated.

`load_deploy` turns a YAML file (or an already-parsed mapping) into a frozen
`DeploySpec`. Everything is checked up front; any problem raises `DeployError`
naming the source, the key path (``stages[1].engine_args.max_num_seqs``) and
what was expected versus what was found. An example::

    name: tiny-three-stage            # optional
    stages:
      - id: 0
        name: thinker
        kind: ar                      # ar | generation | diffusion
        model: null                   # path / built-in name; null = Omni(model=...)
        model_part: thinker           # optional: part of a multi-part checkpoint
        engine_args: {async_scheduling: true, max_num_seqs: 64, dtype: float64}
        default_sampling: {temperature: 0.0, max_tokens: 32}
        final_output: true
        final_output_type: text       # text | audio | image | tokens | latents
        input_timeout_s: 30           # default 60.0: how long a consumer waits for input
        output_keys: [hidden_states.output, ids.output]
        restart: {max_retries: 3, backoff_s: 0.5}   # when its process dies or hangs
                                      # (also max_backoff_s, reset_after_s, hang_timeout_s,
                                      # step_timeout_s)
        backend: process              # process (default) | inprocess | ray
      - id: 1
        name: talker
        kind: ar
        backend: ray                  # Ray actors (docs/deploy.md); its edges go over TCP
        ray: {num_cpus: 1, num_gpus: 0, replicas: 2, max_restarts: 3,
              resources: {}, labels: {node: b}}
    edges:
      - from: thinker                 # stage name or stage id
        to: talker
        processor: hidden_to_embeds   # see omnistage.pipeline.processors
        transfer: payload             # prompt | payload | stream
        connector: shm                # required for payload/stream, absent for prompt
        # stream only: chunk_size (16), first_chunk_size (= chunk_size), chunk_growth (1:
        # each later chunk that many times the one before), max_chunk_size (null: no cap),
        # left_context (0), right_context (0: into a generation stage, items after a chunk
        # its decode sees)
    connectors:                       # inproc and shm exist even when not declared
      remote: {kind: zmq, host: 127.0.0.1}   # kind: inproc | shm | zmq; rest = options

The graph must be acyclic with exactly one entry stage (a stage with no
incoming edge) and at least one final-output stage. Acyclic with one entry
implies every stage is reachable from the entry, so that needs no check of its own.

This module is where deploys come from (a file, a mapping, one model given
without a deploy file, the packaged deploys) and the deploy API (the specs are
re-exported from `deploy_spec`); the checks themselves are in `deploy_parse`.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from omnistage.models import registry
from omnistage.pipeline.deploy_parse import DeployReader, parse_deploy
from omnistage.pipeline.deploy_spec import (  # noqa: F401 (re-exported: the deploy API)
    BACKENDS,
    CONNECTOR_KINDS,
    DEFAULT_CHUNK_SIZE,
    DEFAULT_INPUT_TIMEOUT_S,
    IMPLICIT_CONNECTORS,
    OUTPUT_TYPES,
    STAGE_KINDS,
    TRANSFERS,
    ConnectorSpec,
    DeployError,
    DeploySpec,
    EdgeSpec,
    RayOptions,
    RestartPolicy,
    StageSpec,
)


def load_deploy(source: str | os.PathLike | Mapping[str, Any]) -> DeploySpec:
    """Load and validate a deploy file (a .yaml/.yml path) or an already-parsed mapping."""
    if isinstance(source, Mapping):
        return parse_deploy(DeployReader("<dict>"), source, "deploy")
    if not isinstance(source, (str, os.PathLike)):
        raise DeployError(f"<{type(source).__name__}>", "", "expected a file path or a mapping")
    path = Path(source)
    reader = DeployReader(str(path))
    if not path.is_file():
        reader.fail("", "deploy file not found" if not path.exists() else "not a file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        reader.fail("", f"not valid YAML: {exc}")
    return parse_deploy(reader, data, path.stem)


def single_model_deploy(
    model: str,
    engine_args: Mapping[str, Any] | None = None,
    default_sampling: Mapping[str, Any] | None = None,
) -> DeploySpec:
    """One `ar` stage named "llm" running `model`, returning text, with no edges."""
    stage = {
        "id": 0,
        "name": "llm",
        "kind": "ar",
        "model": model,
        "engine_args": dict(engine_args or {}),
        "default_sampling": dict(default_sampling or {}),
        "final_output": True,
        "final_output_type": "text",
    }
    return parse_deploy(DeployReader("<single_model_deploy>"), {"stages": [stage]}, "single-model")


def deploy_for_model(model: str, engine_args: Mapping[str, Any] | None = None) -> DeploySpec:
    """How `Omni(model=...)` serves a model given without a deploy file: a built-in demo,
    or a checkpoint whose `model_type` has a packaged deploy, with that deploy (its stages
    running the model, `engine_args` applied to each); anything else as one `ar` stage."""
    from omnistage.models.builtin import demo_deploy, demo_model_path

    name = demo_deploy(model)
    if name is not None:
        path = demo_model_path(model)
    else:
        from omnistage.diffusion.model import pipeline_class_name

        path = Path(model).expanduser()
        if path.is_dir() and registry.layout_converter(path) is not None:
            from omnistage.models.loader import resolve_model

            path = resolve_model(model).path  # a family's own layout: its HF view decides
        config = path / "config.json"
        model_type = json.loads(config.read_text()).get("model_type") if config.is_file() else None
        name = registry.deploy_for_model_type(model_type)
        name = name or registry.deploy_for_pipeline_class(pipeline_class_name(path))
    if name is None:
        return single_model_deploy(model, engine_args)
    spec = load_deploy(packaged_deploy_path(name)).with_model(str(path.absolute()))
    return spec.with_engine_args(engine_args) if engine_args else spec


@functools.lru_cache(maxsize=32)
def model_type_of(model: str) -> str | None:
    """The `model_type` of a stage's model (a checkpoint directory's config.json, a
    built-in name, a GGUF file): None where it has no config.json."""
    from omnistage.models.loader import resolve_model

    config = resolve_model(model).path / "config.json"
    return json.loads(config.read_text()).get("model_type") if config.is_file() else None


def check_stage_models(spec: DeploySpec) -> None:
    """Each stage's model has what the stage asks of it: the `model_part` exists in the
    checkpoint (an `ar` part for `ar` stages, a generation part for `generation` ones),
    and a multi-part checkpoint is not served whole. ValueError naming the stage, before
    any stage starts."""
    from omnistage.diffusion.model import diffusion_model_class
    from omnistage.models.loader import resolve_model

    for stage in (s.with_part_directory() for s in spec.stages):
        if stage.model is None:
            continue
        if stage.kind == "diffusion":
            try:
                diffusion_model_class(resolve_model(stage.model).path)
            except ValueError as exc:
                raise ValueError(f"{spec.source}: stages[{stage.name}].model: {exc}") from None
            continue
        model_type = model_type_of(stage.model)
        ar_parts = registry.part_names(model_type)
        gen_parts = registry.generation_part_names(model_type)
        where = f"{spec.source}: stages[{stage.name}]"
        if stage.model_part is None:
            if ar_parts or gen_parts:
                raise ValueError(
                    f"{where}: {stage.model} is a multi-part {model_type} checkpoint; name "
                    f"the part this stage runs with model_part ({', '.join(ar_parts + gen_parts)})"
                )
            continue
        parts = ar_parts if stage.kind == "ar" else gen_parts
        if stage.model_part not in parts:
            raise ValueError(
                f"{where}.model_part: {model_type or 'this'} checkpoints have no "
                f"{stage.kind} part {stage.model_part!r}"
                + (f"; {stage.kind} parts: {', '.join(parts)}" if parts else "")
            )


def packaged_deploy_path(name: str) -> Path:
    """Path of a deploy file shipped with omnistage (a family's `deploys/<name>.yaml`)."""
    deploys = registry.packaged_deploys()
    if name not in deploys:
        known = ", ".join(sorted(deploys)) or "none"
        raise DeployError("<packaged>", "", f"no packaged deploy {name!r}; available: {known}")
    return deploys[name]
