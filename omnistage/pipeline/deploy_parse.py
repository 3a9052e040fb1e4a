"""Checking a deploy mapping and building its `DeploySpec` (see `deploy.py` for the format).

`parse_deploy` checks every stage, edge and connector of an already-parsed mapping
and the graph they make (acyclic, one entry stage, at least one final stage, each
payload key collected one way by the edges out of a stage); any
problem raises `DeployError` naming the source, the key path
(``stages[1].engine_args.max_num_seqs``) and what was expected versus what was
found, with close matches for unknown names.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Mapping
from typing import Any, NoReturn

from omnistage.config import EngineConfig
from omnistage.core.edge_processor import collected_modes
from omnistage.diffusion.params import DiffusionParams
from omnistage.pipeline.deploy_spec import (
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
from omnistage.pipeline.processors import processor_class, processor_names
from omnistage.sampling_params import SamplingParams

_TOP_KEYS = ("name", "stages", "edges", "connectors")
_STREAM_KEYS = (
    "chunk_size",
    "first_chunk_size",
    "chunk_growth",
    "max_chunk_size",
    "left_context",
    "right_context",
)
_EDGE_KEYS = ("from", "to", "processor", "transfer", "connector", *_STREAM_KEYS)
_RESTART_KEYS = tuple(f.name for f in dataclasses.fields(RestartPolicy))
_RAY_KEYS = tuple(f.name for f in dataclasses.fields(RayOptions))
_NAME_RE = re.compile(r"[A-Za-z0-9_-]+")


class DeployReader:
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


def parse_deploy(r: DeployReader, data: Any, default_name: str) -> DeploySpec:
    """The `DeploySpec` of a parsed deploy mapping, checked through `r`."""
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


def _stage(r: DeployReader, raw: Any, path: str) -> StageSpec:
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
        restart=RestartPolicy(
            **r.fields_of(d.get("restart"), f"{path}.restart", RestartPolicy, _RESTART_KEYS)
        ),
        backend=r.choice(d.get("backend", "process"), f"{path}.backend", BACKENDS),
        ray=_ray_options(r, d, path),
    )


def _ray_options(r: DeployReader, d: dict, path: str) -> RayOptions | None:
    """A stage's `ray` mapping: only with `backend: ray` (which gets the defaults without)."""
    backend = d.get("backend", "process")
    if backend != "ray":
        if "ray" in d:
            r.fail(f"{path}.ray", f"only valid with backend: ray, got backend: {backend}")
        return None
    return RayOptions(**r.fields_of(d.get("ray"), f"{path}.ray", RayOptions, _RAY_KEYS))


def _edge(
    r: DeployReader, raw: Any, path: str, stages: tuple[StageSpec, ...], connectors: dict
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
    if transfer == "stream" and processor_class(d["processor"]).stream_key is None:
        r.fail(
            f"{path}.transfer",
            f"processor {d['processor']!r} cannot stream (it declares no stream_key, the "
            "key whose rows make chunks): use transfer: payload",
        )
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
        chunk_growth=r.integer(d.get("chunk_growth", 1), f"{path}.chunk_growth", 1),
        max_chunk_size=None
        if d.get("max_chunk_size") is None
        else r.integer(d["max_chunk_size"], f"{path}.max_chunk_size", chunk),
        left_context=r.integer(d.get("left_context", 0), f"{path}.left_context", 0),
        right_context=right,
    )


def _stage_ref(r: DeployReader, ref: Any, path: str, stages: tuple[StageSpec, ...]) -> str:
    """Resolve a stage name or id to the stage's name."""
    for stage in stages:
        if (isinstance(ref, str) and ref == stage.name) or (
            isinstance(ref, int) and not isinstance(ref, bool) and ref == stage.id
        ):
            return stage.name
    known = ", ".join(f"{s.name} (id {s.id})" for s in stages)
    r.fail(path, f"unknown stage {ref!r}; known stages: {known}")


def _connectors(r: DeployReader, raw: Any) -> dict[str, ConnectorSpec]:
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


def _check_graph(r: DeployReader, spec: DeploySpec) -> None:
    cycle = _find_cycle(spec)
    if cycle:
        r.fail("edges", f"expected an acyclic graph, got the cycle {' -> '.join(cycle)}")
    _ = spec.entry_stages  # raises unless exactly one; acyclic + one entry => all reachable
    if not spec.final_stages:
        r.fail("stages", "expected at least one stage with final_output: true, got none")
    for stage in spec.stages:
        declared = [
            (f"{e.src}->{e.dst} ({e.processor})", processor_class(e.processor).accumulate)
            for e in spec.edges_from(stage.name)
            if e.transfer != "prompt"  # the orchestrator builds those; nothing is collected
        ]
        try:
            collected_modes(declared)
        except ValueError as exc:
            r.fail("edges", str(exc))


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
