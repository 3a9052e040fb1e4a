"""`StageCore`: one stage of a pipeline, driven by control messages.

A stage core owns its engine (an `ARStageEngine` for `ar` stages, a
generation model for `generation` stages, a diffusion engine for `diffusion` ones), the coordinator that parks
requests waiting for input, the accumulators of its outgoing edges and the
connectors it reads and writes. It is the same object in-process (stepped by
the orchestrator's thread) and in a stage process (stepped by
`stage_process.run_stage`): `handle(message)` and `run_step()` return the
messages for the orchestrator.

A failure is contained where it can be pinned: an exception while taking in one
request's message fails that request; one inside a step fails the requests of
that step (`run_step`); either way the stage goes on serving.

Every way a request can end here releases what it holds: the engine's
request, its accumulator, its coordinator entry and its connector buffers.
"""

from __future__ import annotations

import contextlib
import logging
from abc import ABC, abstractmethod
from typing import Any

from omnistage.core.edge_processor import EdgeProcessor
from omnistage.core.payload import Payload
from omnistage.core.step_isolation import StepFailed
from omnistage.pipeline.connectors import Connector, make_connector
from omnistage.pipeline.connectors.base import payload_key
from omnistage.pipeline.coordinator import InputCoordinator, timeout_message
from omnistage.pipeline.deploy import DeploySpec, EdgeSpec, StageSpec
from omnistage.pipeline.messages import (
    AbortRequest,
    DeliverPayload,
    FromStage,
    GetStats,
    PayloadReady,
    Ping,
    Pong,
    RequestFailed,
    StageStats,
    SubmitRequest,
    ToStage,
)
from omnistage.pipeline.processors import get_processor

logger = logging.getLogger(__name__)


def edge_name(edge: EdgeSpec) -> str:
    return f"{edge.src}->{edge.dst}"


class StageCore(ABC):
    """Common control-message handling; subclasses run the model."""

    def __init__(self, spec: StageSpec, deploy: DeploySpec, namespace: str) -> None:
        self.spec = spec
        self.name = spec.name
        self.outgoing = [
            (e, get_processor(e.processor))
            for e in deploy.edges_from(spec.name)
            if e.transfer != "prompt"
        ]
        self.incoming = {
            edge_name(e): (e, get_processor(e.processor))
            for e in deploy.edges_into(spec.name)
            if e.transfer != "prompt"
        }
        used = {e.connector for e, _ in self.outgoing} | {
            e.connector for e, _ in self.incoming.values()
        }
        self.connectors: dict[str, Connector] = {
            name: make_connector(name, c.kind, c.options, namespace=namespace)
            for name, c in deploy.connectors.items()
            if name in used
        }
        self.coordinator = InputCoordinator(spec.input_timeout_s)
        self.stalled = False
        """The last step did nothing though requests are in (they wait for input): the
        stage loop may sleep a little instead of spinning."""

    # -- control messages ---------------------------------------------------------------
    def handle(self, msg: ToStage) -> list[FromStage]:
        """Act on one control message. A request's message that fails (its input is bad or
        lost, or the model or a processor raised on it) fails that request alone."""
        if isinstance(msg, AbortRequest):
            self.abort(msg.request_id)
            return []
        if isinstance(msg, GetStats):
            return [
                StageStats(
                    stage=self.name,
                    counters=self.counters(),
                    gauges=self.gauges(),
                    speculation=self.speculation(),
                )
            ]
        if isinstance(msg, Ping):
            return [Pong(stage=self.name)]
        if not isinstance(msg, SubmitRequest | DeliverPayload):
            raise TypeError(f"stage {self.name!r}: unexpected message {type(msg).__name__}")
        try:
            return self._submit(msg) if isinstance(msg, SubmitRequest) else self._deliver(msg)
        except (ValueError, TimeoutError) as exc:  # one request's input is bad or lost
            return self._fail([msg.request_id], str(exc))
        except Exception as exc:  # the model or a processor failed on this request's input
            logger.exception("stage %s: request %s failed", self.name, msg.request_id)
            return self._fail(
                [msg.request_id], f"failed on this request's input: {type(exc).__name__}: {exc}"
            )

    def run_step(self) -> list[FromStage]:
        """`step`, with a failure inside it contained: the requests the step ran
        (`step_request_ids`, taken before it) fail with the error, naming the stage, and
        release what they held; the stage goes on. An exception inside a batched forward
        is pinned on one request by running the batch's requests alone: an ar stage's
        engine core does it (`StepFailed` names the one), a generation stage retries the
        batch's items one by one, a diffusion engine its requests. A step that fails
        with no request to blame raises: the stage's state is unknown, and the stage process
        exits."""
        in_step = self.step_request_ids()
        try:
            return self.step()
        except StepFailed as exc:  # the engine found whom to blame, and steps on
            message = f"the step running this request failed: {exc}"
            return self._fail(exc.blamed, message)
        except Exception as exc:
            if not in_step:
                raise
            logger.exception(
                "stage %s: a step failed; failing its %d requests", self.name, len(in_step)
            )
            return self._fail(
                in_step, f"the step running this request failed: {type(exc).__name__}: {exc}"
            )

    def _fail(self, request_ids: list[str], message: str) -> list[FromStage]:
        """End `request_ids` here (releasing what they hold) and tell the orchestrator why."""
        for request_id in request_ids:
            self.abort(request_id)
        return [RequestFailed(stage=self.name, request_id=r, message=message) for r in request_ids]

    def _submit(self, msg: SubmitRequest) -> list[FromStage]:
        unknown = [e for e in msg.wait_for if e not in self.incoming]
        if unknown:
            raise ValueError(f"stage {self.name!r} has no incoming edge {unknown[0]!r}")
        if msg.wait_for:
            self.coordinator.park(msg.request_id, msg, msg.wait_for)
            return []
        return self.start(msg, None)

    def _deliver(self, msg: DeliverPayload) -> list[FromStage]:
        if not self.coordinator.is_waiting(msg.request_id):
            # Ended here meanwhile (finished, aborted, failed): free this payload, and only
            # it — other edges of the request may still be in use.
            with contextlib.suppress(ValueError, TimeoutError):
                self.connectors[msg.handle.connector].get(msg.handle)
            return []
        payload = self.connectors[msg.handle.connector].get(msg.handle)
        return self.on_input(msg, payload)

    def check_timeouts(self) -> list[FromStage]:
        failed = []
        for request_id, edge in self.coordinator.expired():
            self.abort(request_id)
            failed.append(
                RequestFailed(
                    stage=self.name,
                    request_id=request_id,
                    message=timeout_message(edge, self.coordinator.timeout_s),
                )
            )
        return failed

    def abort(self, request_id: str) -> None:
        """End `request_id` here however far it got, releasing everything it held."""
        self.coordinator.release(request_id)
        self.drop_request(request_id)
        for connector in self.connectors.values():
            connector.cleanup(request_id)

    # -- outgoing payloads ------------------------------------------------------------------
    def outgoing_for(self, msg: SubmitRequest) -> list[tuple[EdgeSpec, EdgeProcessor]]:
        if msg.send_to is None:
            return self.outgoing
        return [(e, p) for e, p in self.outgoing if edge_name(e) in msg.send_to]

    def send_payloads(
        self, request_id: str, pieces: list[tuple[EdgeSpec, int, Payload, bool]]
    ) -> list[FromStage]:
        ready: list[FromStage] = []
        for edge, index, payload, last in pieces:
            name = edge_name(edge)
            handle = self.connectors[edge.connector].put(
                payload_key(request_id, name, index), payload
            )
            ready.append(
                PayloadReady(
                    stage=self.name,
                    request_id=request_id,
                    edge=name,
                    handle=handle,
                    chunk_index=index,
                    last=last,
                )
            )
        return ready

    # -- subclass interface -------------------------------------------------------------------
    @abstractmethod
    def start(self, msg: SubmitRequest, payloads: dict[str, Payload] | None) -> list[FromStage]:
        """Hand a request whose input is complete to the engine."""

    @abstractmethod
    def on_input(self, msg: DeliverPayload, payload: Payload) -> list[FromStage]:
        """A payload or chunk arrived for a parked request."""

    @abstractmethod
    def drop_request(self, request_id: str) -> None:
        """Forget the request in the engine and accumulators (idempotent)."""

    @abstractmethod
    def step(self) -> list[FromStage]:
        """Run one engine step; the resulting outputs, payload notices and failures."""

    @abstractmethod
    def step_request_ids(self) -> list[str]:
        """The requests the next `step` may run (asked before each step: those a failing
        step fails)."""

    @abstractmethod
    def has_work(self) -> bool: ...

    def counters(self) -> dict[str, Any]:
        return {
            "coordinator_entries": self.coordinator.num_entries,
            "connector_pending": sum(c.num_pending() for c in self.connectors.values()),
        }

    def gauges(self) -> dict[str, float]:
        """Queue depth and KV cache use for metrics: requests waiting (for input, or to be
        scheduled), requests running, fraction of KV blocks in use (0 without a KV cache)."""
        return {
            "num_waiting": float(self.coordinator.num_entries),
            "num_running": 0.0,
            "kv_cache_usage": 0.0,
        }

    def speculation(self) -> dict[str, Any] | None:
        """Speculation totals (`SpecDecodeStats` fields) of a stage that speculates."""
        return None

    def shutdown(self) -> None:
        for connector in self.connectors.values():
            connector.close()
