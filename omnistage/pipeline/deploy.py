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
      - id: 1
        name: talker
        kind: ar
    edges:
      - from: thinker                 # stage name or stage id
        to: talker
        processor: hidden_to_embeds   # see omnistage.pipeline.processors
        transfer: payload             # prompt | payload | stream
        connector: shm                # required for payload/stream, absent for prompt
        # stream only: chunk_size (16), first_chunk_size (= chunk_size), left_context (0),
        # right_context (0: into a generation stage, items after a chunk its decode sees)
    connectors:                       # inproc and shm exist even when not declared
      remote: {kind: zmq, host: 127.0.0.1}   # kind: inproc | shm | zmq; rest = options

The graph must be acyclic with exactly one entry stage (a stage with no
incoming edge) and at least one final-output stage. Acyclic with one entry
implies every stage is reachable from the entry, so that needs no check of its own.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

import yaml

from omnistage.config import EngineConfig
from omnistage.diffusion.params import DiffusionParams
from omnistage.pipeline.deploy_spec import (  # noqa: F401 (re-exported: the deploy API)
    CONNECTOR_KINDS,
    DEFAULT_CHUNK_SIZE,
    DEFAULT_INPUT_TIMEOUT_S,
    DEPLOYS_DIR,
    IMPLICIT_CONNECTORS,
    OUTPUT_TYPES,
    STAGE_KINDS,
    TRANSFERS,
    ConnectorSpec,
    DeployError,
    DeploySpec,
    EdgeSpec,
    StageSpec,
)
from omnistage.pipeline.processors import processor_names
from omnistage.sampling_params import SamplingParams

_TOP_KEYS = ("name", "stages", "edges", "connectors")
_STREAM_KEYS = ("chunk_size", "first_chunk_size", "left_context", "right_context")
_EDGE_KEYS = ("from", "to", "processor", "transfer", "connector", *_STREAM_KEYS)
_NAME_RE = re.compile(r"[A-Za-z0-9_-]+")


def load_deploy(source: str | os.PathLike | Mapping[str, Any]) -> DeploySpec:
    """Load and validate a deploy file (a .yaml/.yml path) or an already-parsed mapping."""
    if isinstance(source, Mapping):
        return _build(_Reader("<dict>"), source, "deploy")
    if not isinstance(source, (str, os.PathLike)):
        raise DeployError(f"<{type(source).__name__}>", "", "expected a file path or a mapping")
    path = Path(source)
    reader = _Reader(str(path))
    if not path.is_file():
        reader.fail("", "deploy file not found" if not path.exists() else "not a file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        reader.fail("", f"not valid YAML: {exc}")
    return _build(reader, data, path.stem)


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
    return _build(_Reader("<single_model_deploy>"), {"stages": [stage]}, "single-model")


PACKAGED_DEPLOYS_BY_MODEL_TYPE = {"qwen3_omni_moe": "qwen3-omni", "qwen2_5_omni": "qwen25-omni"}
"""Checkpoints (by config.json `model_type`) that `Omni(model=...)` serves with a packaged
multi-stage deploy rather than as one text stage."""
PACKAGED_DEPLOYS_BY_PIPELINE_CLASS = {
    "OmnistageTextToImagePipeline": "demo-image",
    "GlmImagePipeline": "glm-image",
}
"""Diffusers-layout checkpoints (by model_index.json `_class_name`) and their deploys."""


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
        config = path / "config.json"
        model_type = json.loads(config.read_text()).get("model_type") if config.is_file() else None
        name = PACKAGED_DEPLOYS_BY_MODEL_TYPE.get(model_type)
        name = name or PACKAGED_DEPLOYS_BY_PIPELINE_CLASS.get(pipeline_class_name(path))
    if name is None:
        return single_model_deploy(model, engine_args)
    spec = load_deploy(packaged_deploy_path(name)).with_model(str(path.absolute()))
    return spec.with_engine_args(engine_args) if engine_args else spec


def check_stage_models(spec: DeploySpec) -> None:
    """Each stage's model has what the stage asks of it: the `model_part` exists in the
    checkpoint (an `ar` part for `ar` stages, a generation part for `generation` ones),
    and a multi-part checkpoint is not served whole. ValueError naming the stage, before
    any stage starts."""
    from omnistage.diffusion.model import diffusion_model_class
    from omnistage.models.generation import GENERATION_PARTS
    from omnistage.models.loader import resolve_model
    from omnistage.models.parts import PARTS

    for stage in (s.with_part_directory() for s in spec.stages):
        if stage.model is None:
            continue
        if stage.kind == "diffusion":
            try:
                diffusion_model_class(resolve_model(stage.model).path)
            except ValueError as exc:
                raise ValueError(f"{spec.source}: stages[{stage.name}].model: {exc}") from None
            continue
        config = resolve_model(stage.model).path / "config.json"
        model_type = json.loads(config.read_text()).get("model_type") if config.is_file() else None
        ar_parts = sorted(p for mt, p in PARTS if mt == model_type)
        gen_parts = sorted(p for mt, p in GENERATION_PARTS if mt == model_type)
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
    """Path of a deploy file shipped with omnistage (omnistage/pipeline/deploys/<name>.yaml)."""
    path = DEPLOYS_DIR / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in DEPLOYS_DIR.glob("*.yaml"))) or "none"
        raise DeployError("<packaged>", "", f"no packaged deploy {name!r}; available: {known}")
    return path


class _Reader:
    """Checks raw values; every failure is a DeployError with the source and key path."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, message: str) -> NoReturn:
        raise DeployError(self.source, path, message)

    def mapping(self, value: Any, path: str, allowed: tuple[str, ...], required=()) -> dict:
        if not isinstance(value, Mapping):
            self.fail(path, f"expected a mapping, got {_show(value)}")
        for key in value:
            if key not in allowed:
                self.fail(_join(path, key), f"unknown key {key!r}{_close(key, allowed)}")
        for key in required:
            if key not in value:
                self.fail(path, f"missing required key {key!r}")
        return dict(value)

    def integer(self, value: Any, path: str, low: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            self.fail(path, f"expected an integer >= {low}, got {_show(value)}")
        return value

    def boolean(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            self.fail(path, f"expected true or false, got {_show(value)}")
        return value

    def choice(self, value: Any, path: str, options: tuple[str, ...]) -> str:
        if value not in options or not isinstance(value, str):
            self.fail(path, f"expected one of {', '.join(options)}, got {_show(value)}")
        return value

    def name(self, value: Any, path: str) -> str:
        if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
            self.fail(path, f"expected a name matching [A-Za-z0-9_-]+, got {_show(value)}")
        return value

    def optional_str(self, value: Any, path: str) -> str | None:
        if value is not None and (not isinstance(value, str) or not value):
            self.fail(path, f"expected a non-empty string or null, got {_show(value)}")
        return value

    def fields_of(self, value: Any, path: str, cls: type, allowed: tuple[str, ...]) -> dict:
        """A mapping of `cls` constructor arguments, checked by constructing `cls` from it."""
        args = self.mapping({} if value is None else value, path, allowed)
        types = {f.name: f.type for f in dataclasses.fields(cls)}
        for key, item in args.items():
            if types[key] in ("bool", bool):
                self.boolean(item, _join(path, key))
            if types[key] in ("str", str) and not isinstance(item, str):
                self.fail(_join(path, key), f"expected a string, got {_show(item)}")
        try:
            cls(**args)
        except (ValueError, TypeError) as exc:
            key, sep, message = str(exc).partition(": ")
            if not (sep and key in args):
                self.fail(path, str(exc))
            if repr(args[key]) not in message:
                message += f" (got {_show(args[key])})"
            self.fail(_join(path, key), message)
        return args


def _build(r: _Reader, data: Any, default_name: str) -> DeploySpec:
    top = r.mapping(data, "", _TOP_KEYS, required=("stages",))
    name = top.get("name", default_name)
    if not isinstance(name, str) or not name:
        r.fail("name", f"expected a non-empty string, got {_show(name)}")
    if not isinstance(top["stages"], list) or not top["stages"]:
        r.fail("stages", f"expected a non-empty list of stages, got {_show(top['stages'])}")
    stages = tuple(_stage(r, raw, f"stages[{i}]") for i, raw in enumerate(top["stages"]))
    for attr in ("id", "name"):
        seen: dict[Any, int] = {}
        for i, stage in enumerate(stages):
            value = getattr(stage, attr)
            if value in seen:
                r.fail(
                    f"stages[{i}].{attr}",
                    f"duplicate {attr} {value!r} (also stages[{seen[value]}])",
                )
            seen[value] = i
    connectors = _connectors(r, top.get("connectors"))
    raw_edges = [] if top.get("edges") is None else top["edges"]
    if not isinstance(raw_edges, list):
        r.fail("edges", f"expected a list of edges, got {_show(raw_edges)}")
    edges: list[EdgeSpec] = []
    for i, raw in enumerate(raw_edges):
        edge = _edge(r, raw, f"edges[{i}]", stages, connectors)
        for j, other in enumerate(edges):
            if (other.src, other.dst) == (edge.src, edge.dst):
                r.fail(f"edges[{i}]", f"duplicate edge {edge.src} -> {edge.dst} (also edges[{j}])")
        edges.append(edge)
    spec = DeploySpec(name, r.source, stages, tuple(edges), connectors)
    _check_graph(r, spec)
    return spec


def _stage(r: _Reader, raw: Any, path: str) -> StageSpec:
    allowed = tuple(f.name for f in dataclasses.fields(StageSpec))
    d = r.mapping(raw, path, allowed, required=("id", "name", "kind"))
    stage_id = r.integer(d["id"], f"{path}.id", 0)
    name = r.name(d["name"], f"{path}.name")
    kind = r.choice(d["kind"], f"{path}.kind", STAGE_KINDS)
    final_output = r.boolean(d.get("final_output", False), f"{path}.final_output")
    output_type = d.get("final_output_type")
    if output_type is not None or final_output:
        r.choice(output_type, f"{path}.final_output_type", OUTPUT_TYPES)
    timeout = d.get("input_timeout_s", DEFAULT_INPUT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        r.fail(f"{path}.input_timeout_s", f"expected a positive number, got {_show(timeout)}")
    if not math.isfinite(timeout):
        r.fail(f"{path}.input_timeout_s", f"expected a finite number, got {timeout!r}")
    keys = d.get("output_keys") or []
    if not isinstance(keys, list):
        r.fail(f"{path}.output_keys", f"expected a list of strings, got {_show(keys)}")
    for i, key in enumerate(keys):
        if not isinstance(key, str) or not key:
            r.fail(f"{path}.output_keys[{i}]", f"expected a non-empty string, got {_show(key)}")
    engine_keys = tuple(sorted(EngineConfig.field_names() - {"model", "model_part"}))
    sampling_cls = DiffusionParams if kind == "diffusion" else SamplingParams
    sampling_keys = tuple(f.name for f in dataclasses.fields(sampling_cls) if f.init)
    return StageSpec(
        id=stage_id,
        name=name,
        kind=kind,
        model=r.optional_str(d.get("model"), f"{path}.model"),
        model_part=r.optional_str(d.get("model_part"), f"{path}.model_part"),
        engine_args=r.fields_of(
            d.get("engine_args"), f"{path}.engine_args", EngineConfig, engine_keys
        ),
        default_sampling=r.fields_of(
            d.get("default_sampling"), f"{path}.default_sampling", sampling_cls, sampling_keys
        ),
        final_output=final_output,
        final_output_type=output_type,
        input_timeout_s=float(timeout),
        output_keys=tuple(keys),
    )


def _edge(
    r: _Reader, raw: Any, path: str, stages: tuple[StageSpec, ...], connectors: dict
) -> EdgeSpec:
    d = r.mapping(raw, path, _EDGE_KEYS, required=("from", "to", "processor", "transfer"))
    src, dst = (_stage_ref(r, d[key], f"{path}.{key}", stages) for key in ("from", "to"))
    if src == dst:
        r.fail(path, f"self-loop: stage {src!r} feeds itself")
    processors = processor_names()
    if d["processor"] not in processors or not isinstance(d["processor"], str):
        r.fail(
            f"{path}.processor",
            f"unknown processor {d['processor']!r}{_close(d['processor'], processors)}",
        )
    transfer = r.choice(d["transfer"], f"{path}.transfer", TRANSFERS)
    connector = d.get("connector")
    if transfer == "prompt" and connector is not None:
        r.fail(f"{path}.connector", f"must be absent for transfer: prompt, got {_show(connector)}")
    if transfer != "prompt" and connector is None:
        r.fail(f"{path}.connector", f"required for transfer: {transfer}")
    if connector is not None and (not isinstance(connector, str) or connector not in connectors):
        r.fail(
            f"{path}.connector", f"unknown connector {connector!r}{_close(connector, connectors)}"
        )
    for key in _STREAM_KEYS:
        if transfer != "stream" and key in d:
            r.fail(f"{path}.{key}", f"only valid with transfer: stream, got transfer: {transfer}")
    chunk = r.integer(d.get("chunk_size", DEFAULT_CHUNK_SIZE), f"{path}.chunk_size", 1)
    right = r.integer(d.get("right_context", 0), f"{path}.right_context", 0)
    kind = next(s.kind for s in stages if s.name == dst)
    if right and kind != "generation":
        r.fail(f"{path}.right_context", f"only valid into a generation stage, {dst!r} is {kind}")
    return EdgeSpec(
        src=src,
        dst=dst,
        processor=d["processor"],
        transfer=transfer,
        connector=connector,
        chunk_size=chunk,
        first_chunk_size=r.integer(d.get("first_chunk_size", chunk), f"{path}.first_chunk_size", 1),
        left_context=r.integer(d.get("left_context", 0), f"{path}.left_context", 0),
        right_context=right,
    )


def _stage_ref(r: _Reader, ref: Any, path: str, stages: tuple[StageSpec, ...]) -> str:
    """Resolve a stage name or id to the stage's name."""
    for stage in stages:
        if (isinstance(ref, str) and ref == stage.name) or (
            isinstance(ref, int) and not isinstance(ref, bool) and ref == stage.id
        ):
            return stage.name
    known = ", ".join(f"{s.name} (id {s.id})" for s in stages)
    r.fail(path, f"unknown stage {ref!r}; known stages: {known}")


def _connectors(r: _Reader, raw: Any) -> dict[str, ConnectorSpec]:
    out = {name: ConnectorSpec(name, name, {}) for name in IMPLICIT_CONNECTORS}
    if raw is None:
        return out
    if not isinstance(raw, Mapping):
        r.fail("connectors", f"expected a mapping of name -> connector, got {_show(raw)}")
    for name, body in raw.items():
        path = f"connectors.{name}"
        r.name(name, path)
        if not isinstance(body, Mapping):
            r.fail(path, f"expected a mapping with a 'kind' key, got {_show(body)}")
        options = dict(body)
        kind = r.choice(options.pop("kind", None), f"{path}.kind", CONNECTOR_KINDS)
        out[name] = ConnectorSpec(name, kind, options)
    return out


def _check_graph(r: _Reader, spec: DeploySpec) -> None:
    cycle = _find_cycle(spec)
    if cycle:
        r.fail("edges", f"expected an acyclic graph, got the cycle {' -> '.join(cycle)}")
    _ = spec.entry_stages  # raises unless exactly one; acyclic + one entry => all reachable
    if not spec.final_stages:
        r.fail("stages", "expected at least one stage with final_output: true, got none")


def _find_cycle(spec: DeploySpec) -> list[str] | None:
    done: set[str] = set()
    stack: list[str] = []

    def visit(name: str) -> list[str] | None:
        stack.append(name)
        for edge in spec.edges_from(name):
            if edge.dst in stack:
                return [*stack[stack.index(edge.dst) :], edge.dst]
            if edge.dst not in done and (found := visit(edge.dst)):
                return found
        done.add(stack.pop())
        return None

    for stage in spec.stages:
        if stage.name not in done and (found := visit(stage.name)):
            return found
    return None


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _show(value: Any) -> str:
    if value is None:
        return "null"
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def _close(value: Any, options: Any) -> str:
    """' (did you mean ...?); expected one of: ...' suffix for an unknown name."""
    options = sorted(str(o) for o in options)
    close = difflib.get_close_matches(str(value), options, n=3)
    hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
    return f"{hint}; expected one of: {', '.join(options) or 'none'}"
