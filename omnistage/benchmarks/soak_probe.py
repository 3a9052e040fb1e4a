"""`omnistage bench soak`'s view of one running server: its resource counters, read from
outside as an operator would, and an RSS curve sampled through the load.

Counters (`Counters`):

- from GET /metrics, per stage (`llm` for a text model; thinker / talker / code2wav or
  thinker / draw for the pipelines): `omnistage_num_requests_waiting` (for a pipeline
  stage this includes requests parked waiting for their input: coordinator entries),
  `omnistage_num_requests_running`, `omnistage_kv_cache_usage_ratio` (KV blocks in use);
  a pipeline's `omnistage_stage_resources_held` (each stage's engine requests, KV
  blocks, accumulator and coordinator entries, queued items) and
  `omnistage_pipeline_open_requests` (the orchestrator's, as stage `orchestrator`);
  and, not a resource but the proof that speculation ran, the draft and accepted token
  totals of the stages that speculate;
- from /proc, for the server process and every process under it (a text model's runner
  worker, a pipeline's stage processes): open file descriptors, threads, the number of
  processes, and the resident set size (VmRSS, summed);
- from /dev/shm: the shared-memory segments of the server's connector (the soak names
  its pipelines' shm connector, so its segments are told apart from any other
  pipeline's on the machine: `omni_<namespace>_<h6(connector)>_...`).

At idle every per-stage gauge and the segment count must be 0 and the processes as
many as after the warm-up. Descriptors are read at idle after the warm-up, halfway
through the load and at its end: a leak grows with the requests, so it is a count that
rose in both halves (one that rose once and then held is something made lazily, once:
a pool, a socket and its event descriptors).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import threading
import time
from typing import Any

SHM_DIR = "/dev/shm"
_GAUGES = {
    "omnistage_num_requests_waiting": "waiting",
    "omnistage_num_requests_running": "running",
    "omnistage_kv_cache_usage_ratio": "kv_usage",
}
_SPECULATION = {
    "omnistage_spec_decode_num_draft_tokens_total": "draft_tokens",
    "omnistage_spec_decode_num_accepted_tokens_total": "accepted_tokens",
}
_SAMPLE = re.compile(r'^(\w+)\{stage="([^"]+)"\} (\S+)$')
_RESOURCE = re.compile(r"^omnistage_stage_resources_held\{([^}]*)\} (\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')
_OPEN = re.compile(r"^omnistage_pipeline_open_requests (\S+)$")


@dataclasses.dataclass
class Counters:
    """One look at a server's resources."""

    stages: dict[str, dict[str, float]]
    """Stage -> {waiting, running, kv_usage, and a pipeline stage's resources} from
    /metrics (the orchestrator as stage `orchestrator`: {open_requests})."""
    speculation: dict[str, dict[str, float]]
    """Stage -> {draft_tokens, accepted_tokens} (totals) for the stages that speculate."""
    shm_segments: int
    fds: int
    threads: int
    processes: int
    rss_mb: float

    def busy(self) -> dict[str, float]:
        """Every counter that must be 0 at idle and is not (`stage.gauge` -> value)."""
        out = {f"{s}.{g}": v for s, gauges in self.stages.items() for g, v in gauges.items() if v}
        return out | ({"shm_segments": self.shm_segments} if self.shm_segments else {})

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"rss_mb": round(self.rss_mb, 1)}


def shm_connector_hash(connector: str) -> str:
    """The part of a segment's name that names its connector (see connectors/shm.py)."""
    return hashlib.blake2b(connector.encode(), digest_size=16).hexdigest()[:6]


def parse_stage_samples(metrics_text: str, names: dict[str, str]) -> dict[str, dict[str, float]]:
    """Stage -> {short name: value} of the per-stage samples named in `names`."""
    stages: dict[str, dict[str, float]] = {}
    for line in metrics_text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1) in names:
            stages.setdefault(match.group(2), {})[names[match.group(1)]] = float(match.group(3))
    return stages


def parse_held(metrics_text: str) -> dict[str, dict[str, float]]:
    """Stage -> {resource: value} of a pipeline's resource gauges, and the orchestrator's
    open requests (as stage `orchestrator`)."""
    held: dict[str, dict[str, float]] = {}
    for line in metrics_text.splitlines():
        if match := _RESOURCE.match(line):
            labels = dict(_LABEL.findall(match.group(1)))
            held.setdefault(labels["stage"], {})[labels["resource"]] = float(match.group(2))
        elif match := _OPEN.match(line):
            held["orchestrator"] = {"open_requests": float(match.group(1))}
    return held


def process_tree(pid: int) -> list[int]:
    """`pid` and every live process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        tree.append(current := todo.pop())
        todo.extend(children.get(current, []))
    return tree


def _status_fields(pid: int) -> tuple[float, int]:
    rss_kb, threads = 0.0, 0
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    rss_kb = float(line.split()[1])
                elif line.startswith("Threads:"):
                    threads = int(line.split()[1])
    except OSError:
        pass
    return rss_kb, threads


def _fd_count(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


class Probe:
    """Reads the counters of the server `pid` answering at `base_url` (`.../v1`)."""

    def __init__(self, pid: int, base_url: str, shm_connector: str | None) -> None:
        self.pid = pid
        self.metrics_url = base_url.rstrip("/").removesuffix("/v1") + "/metrics"
        tag = shm_connector_hash(shm_connector) if shm_connector else None
        self._shm = re.compile(rf"^omni_[0-9a-z]+_{tag}_") if tag else None

    def rss_mb(self) -> float:
        return sum(_status_fields(p)[0] for p in process_tree(self.pid)) / 1024

    def shm_segments(self) -> int:
        if self._shm is None:
            return 0
        return sum(1 for name in os.listdir(SHM_DIR) if self._shm.match(name))

    def snapshot(self) -> Counters:
        import httpx

        text = httpx.get(self.metrics_url, timeout=30.0, trust_env=False).text
        tree = process_tree(self.pid)
        fields = [_status_fields(p) for p in tree]
        stages = parse_stage_samples(text, _GAUGES)
        for stage, resources in parse_held(text).items():
            stages.setdefault(stage, {}).update(resources)
        return Counters(
            stages=stages,
            speculation=parse_stage_samples(text, _SPECULATION),
            shm_segments=self.shm_segments(),
            fds=sum(_fd_count(p) for p in tree),
            threads=sum(t for _, t in fields),
            processes=len(tree),
            rss_mb=sum(r for r, _ in fields) / 1024,
        )

    def wait_idle(self, processes: int, timeout: float) -> tuple[Counters, float]:
        """Poll until every gauge and segment count is 0, `processes` processes are left
        and the descriptor count holds still for a poll (or `timeout` passes); the last
        look and the seconds it took."""
        start, last_fds = time.monotonic(), -1
        while True:
            now = self.snapshot()
            settled = not now.busy() and now.processes == processes and now.fds == last_fds
            if settled or time.monotonic() - start > timeout:
                return now, time.monotonic() - start
            last_fds = now.fds
            time.sleep(0.25)


class RssSampler:
    """A thread sampling (seconds, generations done, RSS MB, shm segments) every
    `interval` seconds until `stop()`."""

    def __init__(self, probe: Probe, interval: float, done: Any) -> None:
        self.probe, self.interval, self.done = probe, interval, done
        self.points: list[tuple[float, int, float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="soak-rss")
        self._start = time.monotonic()

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _sample(self) -> None:
        t = time.monotonic() - self._start
        self.points.append((t, self.done(), self.probe.rss_mb(), self.probe.shm_segments()))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()
