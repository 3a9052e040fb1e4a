"""Prometheus metrics of one server, in a registry of its own (one per app).

Everything the engine reports carries a `stage` label ("llm" for a single model;
a pipeline's stage names, e.g. thinker / talker / code2wav), so one dashboard reads
single models and pipelines alike:

| metric | type | labels |
| --- | --- | --- |
| omnistage_http_requests_total | counter | method, route, status |
| omnistage_requests_finished_total | counter | stage, reason (stop, length, abort) |
| omnistage_prompt_tokens_total, omnistage_generation_tokens_total | counter | stage |
| omnistage_num_requests_waiting, omnistage_num_requests_running | gauge | stage |
| omnistage_kv_cache_usage_ratio | gauge (0..1) | stage |
| omnistage_time_to_first_token_seconds | histogram | stage |
| omnistage_inter_token_latency_seconds | histogram | stage |
| omnistage_e2e_request_latency_seconds | histogram | stage |
| omnistage_time_to_first_audio_seconds | histogram | stage (the pipeline's audio stage) |
| omnistage_spec_decode_num_drafts_total | counter | stage (request-steps that verified drafts) |
| omnistage_spec_decode_num_draft_tokens_total | counter | stage |
| omnistage_spec_decode_num_accepted_tokens_total | counter | stage |
| omnistage_spec_decode_num_accepted_tokens_per_pos_total | counter | stage, position |
| omnistage_stage_up | gauge (1 up, 0 restarting or down) | stage (pipelines) |
| omnistage_stage_restarts_total | counter | stage (pipelines: its process started again) |
| omnistage_stage_failures_total | counter | stage (pipelines: died, hung, failed to start) |
| omnistage_stage_resources_held | gauge (0 when idle) | stage, resource (pipelines: engine requests, KV blocks, accumulator and coordinator entries, queued items) |
| omnistage_pipeline_open_requests | gauge (0 when idle) | – (pipelines: the orchestrator's requests) |

Stage-level histograms for other outputs (time to first audio packet) belong here
too, added with the stage kinds that produce them, labelled the same way.
`ServerMetrics` implements `client.EngineObserver`; gauges read the
stage's `EngineStats` snapshot when scraped (a pipeline's: each stage's
`StageGauges`, asked of the stages at each scrape). Pipelines do not feed the
per-token series (TTFT, ITL, tokens, e2e) yet; they report TTFA of their audio
stage and the gauges of every stage.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from omnistage.entrypoints.openai.client import EngineStats, StageGauges

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class ServerMetrics:
    """The metrics of one app; `render()` is the body of GET /metrics."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.http_requests = Counter(
            "omnistage_http_requests",
            "HTTP requests answered",
            ["method", "route", "status"],
            registry=r,
        )
        self.requests_finished = Counter(
            "omnistage_requests_finished",
            "Requests ended, by reason",
            ["stage", "reason"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "omnistage_prompt_tokens", "Prompt tokens of ended requests", ["stage"], registry=r
        )
        self.generation_tokens = Counter(
            "omnistage_generation_tokens", "Tokens generated", ["stage"], registry=r
        )
        self.num_waiting = Gauge(
            "omnistage_num_requests_waiting",
            "Requests waiting to be scheduled",
            ["stage"],
            registry=r,
        )
        self.num_running = Gauge(
            "omnistage_num_requests_running", "Requests being computed", ["stage"], registry=r
        )
        self.kv_cache_usage = Gauge(
            "omnistage_kv_cache_usage_ratio",
            "Fraction of KV cache blocks in use",
            ["stage"],
            registry=r,
        )
        self.ttft = Histogram(
            "omnistage_time_to_first_token_seconds",
            "Arrival to first generated token",
            ["stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "omnistage_inter_token_latency_seconds",
            "Time between a request's token steps",
            ["stage"],
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "omnistage_e2e_request_latency_seconds",
            "Arrival to end of a request",
            ["stage"],
            buckets=E2E_BUCKETS,
            registry=r,
        )

        self.ttfa = Histogram(
            "omnistage_time_to_first_audio_seconds",
            "Arrival to the first audio packet of a speaking pipeline",
            ["stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

    def track_stage(self, stage: str, stats: Callable[[], EngineStats | StageGauges]) -> None:
        """Read the stage's queue depth and KV cache usage from `stats` at each scrape (a
        pipeline's stages: from the snapshot `PipelineClient.refresh_stage_stats` took
        just before)."""
        self.num_waiting.labels(stage).set_function(lambda: stats().num_waiting)
        self.num_running.labels(stage).set_function(lambda: stats().num_running)
        self.kv_cache_usage.labels(stage).set_function(lambda: stats().kv_cache_usage)
        self.registry.register(_SpecDecodeCollector(stage, stats))
        self.registry.register(_StageResourcesCollector(stage, stats))

    def track_stage_health(self, health: Callable[[], Mapping[str, Any]]) -> None:
        """Export whether each of a pipeline's stages is up, and its restarts and failures,
        read from `health()` (stage name to `StageHealth`) at each scrape."""
        self.registry.register(_StageHealthCollector(health))

    def track_open_requests(self, count: Callable[[], int]) -> None:
        """Export the requests a pipeline's orchestrator tracks, read at each scrape."""
        Gauge(
            "omnistage_pipeline_open_requests",
            "Requests the pipeline's orchestrator tracks (0 when idle)",
            registry=self.registry,
        ).set_function(count)

    # -- EngineObserver (engine thread) ---------------------------------------------------------
    def on_first_token(self, stage: str, seconds: float) -> None:
        self.ttft.labels(stage).observe(seconds)

    def on_inter_token(self, stage: str, seconds: float) -> None:
        self.itl.labels(stage).observe(seconds)

    def on_finished(
        self, stage: str, reason: str, prompt_tokens: int, generated_tokens: int, seconds: float
    ) -> None:
        self.requests_finished.labels(stage, reason).inc()
        self.prompt_tokens.labels(stage).inc(prompt_tokens)
        self.generation_tokens.labels(stage).inc(generated_tokens)
        self.e2e.labels(stage).observe(seconds)

    def on_first_audio(self, stage: str, seconds: float) -> None:
        self.ttfa.labels(stage).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _SpecDecodeCollector(Collector):
    """Speculation counters of one stage, read from its stats snapshot at each scrape
    (nothing is exported for a stage that does not speculate)."""

    def __init__(self, stage: str, stats: Callable[[], Any]) -> None:
        self.stage = stage
        self.stats = stats

    def collect(self) -> Iterator[CounterMetricFamily]:
        spec = getattr(self.stats(), "spec_decode", None)
        if spec is None:
            return
        for name, doc, value in (
            ("num_drafts", "Request-steps that verified drafts", spec.num_verifying_steps),
            ("num_draft_tokens", "Draft tokens verified", spec.num_draft_tokens),
            ("num_accepted_tokens", "Draft tokens accepted", spec.num_accepted_tokens),
        ):
            family = CounterMetricFamily(f"omnistage_spec_decode_{name}", doc, labels=["stage"])
            family.add_metric([self.stage], value)
            yield family
        per_pos = CounterMetricFamily(
            "omnistage_spec_decode_num_accepted_tokens_per_pos",
            "Drafts accepted at each draft position",
            labels=["stage", "position"],
        )
        for position, value in enumerate(spec.accepted_per_position):
            per_pos.add_metric([self.stage, str(position)], value)
        yield per_pos


class _StageResourcesCollector(Collector):
    """What one pipeline stage holds (`StageGauges.resources`), read from its stats
    snapshot at each scrape: every value is 0 when nothing runs (a leak check's view)."""

    def __init__(self, stage: str, stats: Callable[[], Any]) -> None:
        self.stage = stage
        self.stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily]:
        resources = getattr(self.stats(), "resources", None)
        if not resources:
            return
        family = GaugeMetricFamily(
            "omnistage_stage_resources_held",
            "What the stage holds for requests (0 when idle)",
            labels=["stage", "resource"],
        )
        for name, value in sorted(resources.items()):
            family.add_metric([self.stage, name], float(value))
        yield family


class _StageHealthCollector(Collector):
    """A pipeline's stage health (the orchestrator's supervisor), read at each scrape."""

    def __init__(self, health: Callable[[], Mapping[str, Any]]) -> None:
        self.health = health

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        up = GaugeMetricFamily(
            "omnistage_stage_up",
            "1 while the stage serves, 0 while it restarts or is down",
            labels=["stage"],
        )
        restarts = CounterMetricFamily(
            "omnistage_stage_restarts",
            "Times the stage's process was started again",
            labels=["stage"],
        )
        failures = CounterMetricFamily(
            "omnistage_stage_failures",
            "Times the stage died, hung or failed to start",
            labels=["stage"],
        )
        for stage, health in self.health().items():
            up.add_metric([stage], 1.0 if health.state == "up" else 0.0)
            restarts.add_metric([stage], health.restarts)
            failures.add_metric([stage], health.failures)
        yield from (up, restarts, failures)


class HttpMetricsMiddleware:
    """Counts every HTTP response by method, route template and status (ASGI middleware,
    so streamed responses count once, when they start)."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        counted = False

        async def counting_send(message: Message) -> None:
            nonlocal counted
            if message["type"] == "http.response.start" and not counted:
                counted = True
                route = scope.get("route")
                path = getattr(route, "path", None) or "unmatched"  # no label per random URL
                method = scope.get("method", "")
                method = method if method in _METHODS else "other"
                self.metrics.http_requests.labels(method, path, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counting_send)


_METHODS = {"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"}
