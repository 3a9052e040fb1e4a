"""The parts of a pipeline as a deploy file describes them: stages, edges, connectors.

Frozen dataclasses, each field documented; `DeploySpec` answers graph questions
(entry and final stages, edges in and out, topological order). They are built
and validated by `omnistage.pipeline.deploy.load_deploy`, and every problem is
a `DeployError` naming the source, the key path and what was expected.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STAGE_KINDS = ("ar", "generation", "diffusion")
OUTPUT_TYPES = ("text", "audio", "image", "tokens", "latents")
TRANSFERS = ("prompt", "payload", "stream")
CONNECTOR_KINDS = ("inproc", "shm", "zmq")
BACKENDS = ("process", "inprocess", "ray")
IMPLICIT_CONNECTORS = ("inproc", "shm")
DEFAULT_INPUT_TIMEOUT_S = 60.0
DEFAULT_CHUNK_SIZE = 16
DEFAULT_HANG_TIMEOUT_S = 60.0
DEFAULT_STEP_TIMEOUT_S = 600.0
MAX_PING_INTERVAL_S = 5.0
"""An idle stage is pinged, and a busy one says it is busy, at least this often (more often
with a short hang timeout)."""


class DeployError(ValueError):
    """A deploy file problem: names the source, the key path, and expected versus got."""

    def __init__(self, source: str, path: str, message: str) -> None:
        self.source, self.key_path, self.reason = source, path, message
        super().__init__(f"{source}: {path}: {message}" if path else f"{source}: {message}")

    def __reduce__(self):  # survives pickling across stage processes
        return type(self), (self.source, self.key_path, self.reason)


@dataclass(frozen=True)
class ConnectorSpec:
    """One entry of the `connectors` section."""

    name: str
    """Name edges refer to (`connector: <name>`)."""

    kind: str
    """Transport: inproc, shm or zmq."""

    options: dict[str, Any] = field(default_factory=dict)
    """Every other key of the entry, passed to the connector unchanged."""


def _finite_at_least(value: Any, low: float, strict: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return False
    return value > low if strict else value >= low


@dataclass(frozen=True)
class RestartPolicy:
    """What the orchestrator does when a stage's process dies or hangs (a stage's `restart`
    mapping). The stage's requests in flight fail at once either way (a 503 naming it);
    meanwhile the pipeline reports itself degraded (see docs/reliability.md)."""

    max_retries: int = 3
    """Restarts in a row before the stage is given up (it then stays down and every request
    that needs it fails); 0: never restart."""

    backoff_s: float = 0.5
    """Wait before the first restart; doubled for each further try in a row."""

    max_backoff_s: float = 30.0
    """The longest wait between two tries."""

    reset_after_s: float = 60.0
    """A restarted stage that stays up this long starts its count of tries afresh."""

    hang_timeout_s: float | None = DEFAULT_HANG_TIMEOUT_S
    """A stage process that says nothing this long is killed (and restarted like a dead
    one): it answers pings between steps, and a thread of its own says it is busy while a
    step runs, so only a stopped or frozen process is silent. None: never."""

    step_timeout_s: float | None = DEFAULT_STEP_TIMEOUT_S
    """A stage whose loop stays busy in one step (or one batch of messages) this long is
    taken as stuck — a deadlock, a stuck device — and killed like a hung one; it must
    exceed the stage's longest step. None: never."""

    def __post_init__(self) -> None:
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int):
            raise ValueError(f"max_retries: expected an integer >= 0, got {self.max_retries!r}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries: expected an integer >= 0, got {self.max_retries!r}")
        for name in ("backoff_s", "max_backoff_s", "reset_after_s"):
            if not _finite_at_least(getattr(self, name), 0.0, strict=False):
                raise ValueError(
                    f"{name}: expected a finite number >= 0, got {getattr(self, name)!r}"
                )
        for name in ("hang_timeout_s", "step_timeout_s"):
            limit = getattr(self, name)
            if limit is not None and not _finite_at_least(limit, 0.0, strict=True):
                raise ValueError(f"{name}: expected a finite number > 0 or null, got {limit!r}")

    @property
    def heartbeat_interval_s(self) -> float | None:
        """How often the supervisor pings a silent stage and a busy stage says it is busy:
        a quarter of the shorter timeout, at most `MAX_PING_INTERVAL_S`; None when neither
        timeout is set (nothing to watch)."""
        limits = [t for t in (self.hang_timeout_s, self.step_timeout_s) if t is not None]
        return min(min(limits) / 4, MAX_PING_INTERVAL_S) if limits else None

    def backoff(self, attempt: int) -> float:
        """The wait before try `attempt` (1 for the first) of a run of restarts."""
        return min(self.backoff_s * 2 ** max(attempt - 1, 0), self.max_backoff_s)


@dataclass(frozen=True)
class RayOptions:
    """Where and how a stage with `backend: ray` runs (a stage's `ray` mapping): each
    replica is a Ray actor placed by these resources (see docs/deploy.md)."""

    num_cpus: float = 1.0
    """CPUs each replica's actor reserves (also its torch threads, unless engine_args
    set num_threads)."""

    num_gpus: float = 0.0
    """GPUs each replica's actor reserves."""

    resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources each replica reserves (e.g. {"talker_node": 1})."""

    labels: dict[str, str] = field(default_factory=dict)
    """Node labels a replica's node must carry (Ray's label_selector)."""

    replicas: int = 1
    """Actors serving the stage; the orchestrator gives each request to the one with the
    fewest requests in flight."""

    max_restarts: int = 3
    """Times Ray restarts a replica's actor that died (0: never); its requests fail."""

    def __post_init__(self) -> None:
        for name in ("num_cpus", "num_gpus"):
            if not _finite_at_least(getattr(self, name), 0.0, strict=False):
                raise ValueError(
                    f"{name}: expected a finite number >= 0, got {getattr(self, name)!r}"
                )
        for name, low in (("replicas", 1), ("max_restarts", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}: expected an integer >= {low}, got {value!r}")
        if not isinstance(self.resources, dict) or not all(
            isinstance(k, str) and _finite_at_least(v, 0.0, strict=False)
            for k, v in self.resources.items()
        ):
            raise ValueError(
                f"resources: expected a mapping of name to a number >= 0, got {self.resources!r}"
            )
        if not isinstance(self.labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.labels.items()
        ):
            raise ValueError(f"labels: expected a mapping of string to string, got {self.labels!r}")


@dataclass(frozen=True)
class StageSpec:
    """One stage of the pipeline."""

    id: int
    """Unique non-negative integer; edges may refer to the stage by it."""

    name: str
    """Unique name matching [A-Za-z0-9_-]+; edges and outputs refer to the stage by it."""

    kind: str
    """ar (autoregressive LLM engine), generation (e.g. a vocoder) or diffusion."""

    model: str | None = None
    """Built-in model name or path; None means the model given to the pipeline."""

    model_part: str | None = None
    """Which part of a multi-part checkpoint this stage runs (e.g. thinker); None for all."""

    engine_args: dict[str, Any] = field(default_factory=dict)
    """`EngineConfig` fields for this stage, `model` excluded."""

    default_sampling: dict[str, Any] = field(default_factory=dict)
    """`SamplingParams` fields used when a request gives none for this stage."""

    final_output: bool = False
    """Whether this stage's output is returned to the caller."""

    final_output_type: str | None = None
    """text, audio, image, tokens or latents; required when final_output is true."""

    input_timeout_s: float = DEFAULT_INPUT_TIMEOUT_S
    """How long a request waits for its input payload before it fails."""

    output_keys: tuple[str, ...] = ()
    """Payload keys this stage produces for its outgoing edges."""

    restart: RestartPolicy = field(default_factory=RestartPolicy)
    """How a stage process that dies or hangs is restarted (stage processes only)."""

    backend: str = "process"
    """Where the stage runs: process (a process of its own on this host), inprocess (in
    the orchestrator's thread) or ray (Ray actors, see `ray`)."""

    ray: RayOptions | None = None
    """backend ray only: resources, placement, replicas and restarts of its actors."""

    @property
    def instances(self) -> tuple[str, ...]:
        """The names the orchestrator knows the stage's runners by: the stage's own name,
        or `name#i` for each replica of a replicated Ray stage."""
        if self.ray is None or self.ray.replicas == 1:
            return (self.name,)
        return tuple(f"{self.name}#{i}" for i in range(self.ray.replicas))

    def with_part_directory(self) -> StageSpec:
        """A checkpoint kept as a directory per part (thinker/, talker/, vocoder/ ...): the
        stage then runs that directory's whole model. Otherwise the spec itself."""
        if self.model and self.model_part and (Path(self.model) / self.model_part).is_dir():
            return dataclasses.replace(
                self, model=str(Path(self.model) / self.model_part), model_part=None
            )
        return self


@dataclass(frozen=True)
class EdgeSpec:
    """A directed edge: how one stage's output reaches another stage."""

    src: str
    """Producer stage name."""

    dst: str
    """Consumer stage name."""

    processor: str
    """Registered edge processor that turns the producer's output into the consumer's input."""

    transfer: str
    """prompt (orchestrator builds the next prompt), payload (sent at finish) or stream (chunks)."""

    connector: str | None = None
    """Connector name carrying payload/stream data; None for prompt transfer."""

    chunk_size: int = DEFAULT_CHUNK_SIZE
    """Stream only: items per chunk after the first."""

    first_chunk_size: int = DEFAULT_CHUNK_SIZE
    """Stream only: items in the first chunk (small for a low time to first output)."""

    left_context: int = 0
    """Stream only: items of the previous chunks repeated before each chunk."""

    right_context: int = 0
    """Stream only, into a generation stage: items after each chunk that its decode must see
    (a model that looks ahead); the consumer holds back the last `right_context` items of
    each chunk until the next chunk (or the end) brings the items after them."""

    chunk_growth: int = 1
    """Stream only: each chunk after the second is this many times the one before, up to
    `max_chunk_size` (CosyVoice's growing hop: 25, 50, 100, 100, ... tokens, so a long
    answer takes fewer, larger decodes); 1: every chunk after the first is `chunk_size`."""

    max_chunk_size: int | None = None
    """Stream only: the largest chunk a growing schedule reaches (None: no cap)."""


@dataclass(frozen=True)
class DeploySpec:
    """A validated pipeline: stages in file order, edges by stage name, connectors by name."""

    name: str
    """The file's `name`, else the file name without suffix (or "deploy" for a mapping)."""

    source: str
    """Where it was loaded from: a file path or "<dict>"."""

    stages: tuple[StageSpec, ...]
    """Stages in the order they were declared."""

    edges: tuple[EdgeSpec, ...] = ()
    """Edges in the order they were declared."""

    connectors: dict[str, ConnectorSpec] = field(default_factory=dict)
    """Declared connectors plus the implicit inproc and shm ones."""

    def stage(self, name: str) -> StageSpec:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(f"unknown stage {name!r}; known: {', '.join(s.name for s in self.stages)}")

    def edges_from(self, name: str) -> tuple[EdgeSpec, ...]:
        return tuple(e for e in self.edges if e.src == name)

    def edges_into(self, name: str) -> tuple[EdgeSpec, ...]:
        return tuple(e for e in self.edges if e.dst == name)

    @property
    def entry_stages(self) -> tuple[StageSpec, ...]:
        """The stage with no incoming edge; a DeployError unless there is exactly one."""
        entries = tuple(s for s in self.stages if not self.edges_into(s.name))
        if len(entries) != 1:
            got = ", ".join(s.name for s in entries) or "none"
            raise DeployError(
                self.source, "edges", f"expected exactly one entry stage, got {len(entries)}: {got}"
            )
        return entries

    @property
    def is_pipeline(self) -> bool:
        """Whether it runs as a pipeline rather than one plain text model: more than one
        stage, or one stage serving a part of a multi-part checkpoint (a thinker alone)."""
        return len(self.stages) > 1 or self.stages[0].model_part is not None

    @property
    def final_stages(self) -> tuple[StageSpec, ...]:
        return tuple(s for s in self.stages if s.final_output)

    def topological_order(self) -> tuple[str, ...]:
        """Stage names, producers before consumers; ties keep declaration order."""
        indegree = {s.name: len(self.edges_into(s.name)) for s in self.stages}
        ready = [name for name, n in indegree.items() if n == 0]
        order: list[str] = []
        while ready:
            order.append(ready.pop(0))
            for edge in self.edges_from(order[-1]):
                indegree[edge.dst] -= 1
                if indegree[edge.dst] == 0:
                    ready.append(edge.dst)
        if len(order) != len(self.stages):
            raise DeployError(self.source, "edges", "the stage graph has a cycle")
        return tuple(order)

    def with_engine_args(self, engine_args: Mapping[str, Any]) -> DeploySpec:
        """A copy where every stage's engine_args are overridden by `engine_args`."""
        stages = tuple(
            dataclasses.replace(s, engine_args={**s.engine_args, **engine_args})
            for s in self.stages
        )
        return dataclasses.replace(self, stages=stages)

    def with_model(self, model: str) -> DeploySpec:
        """A copy where every stage with model None runs `model`."""
        stages = tuple(
            dataclasses.replace(s, model=model) if s.model is None else s for s in self.stages
        )
        return dataclasses.replace(self, stages=stages)
