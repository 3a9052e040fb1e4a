"""`StageSet`: the running stages of one pipeline and the sockets to reach them.

It starts every stage (a spawned process each, in this process, or Ray actors,
as each stage's `backend` says), waits until all report ready, and gives the
orchestrator what it needs to talk to them: `send` (to a replicated stage: to the
replica its `ReplicaBalancer` gave the request), the events they reported
(`poll_clients` for in-process and Ray stages, `drain_inbox` for the shared ZMQ
inbox of stage processes), their exit codes, `restart` (a stage process afresh, or
a Ray replica once Ray restarted its actor, after the supervisor reaped the dead
one with `reap`), `release_request` (the shared memory of a request that failed),
and `close`, which stops every stage and unlinks any shared memory a crashed one
left behind. Clients are keyed by instance: the stage's name, or `name#i` for
replica i of a replicated Ray stage.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import time

import zmq

from omnistage.child import ChildError
from omnistage.pipeline.connectors import Connector, make_connector
from omnistage.pipeline.deploy import DeploySpec, StageSpec
from omnistage.pipeline.messages import (
    FromStage,
    StageFatal,
    StageReady,
    SubmitRequest,
    ToStage,
    drain_reports,
)
from omnistage.pipeline.ray_stage import (
    RayStageClient,
    RayTransport,
    with_tcp_edges,
    with_zmq_host,
)
from omnistage.pipeline.replicas import ReplicaBalancer
from omnistage.pipeline.stage_process import (
    InProcessStageClient,
    ProcessStageClient,
    StageClient,
)

logger = logging.getLogger(__name__)
READY_POLL_MS = 200


class StageSet:
    def __init__(
        self,
        deploy: DeploySpec,
        namespace: str,
        context: zmq.Context,
        in_process: bool,
        startup_timeout_s: float,
    ) -> None:
        self.deploy = deploy
        self.namespace = namespace
        self.context = context
        self.in_process = in_process
        self._starts: dict[str, int] = {}
        """How many times each stage process was started (its inbound socket's name)."""
        self._shm = _shm_connectors(deploy, namespace)
        self._tmpdir = tempfile.TemporaryDirectory(prefix="omnistage-")
        self.inbox = context.socket(zmq.PULL)
        self.inbox.setsockopt(zmq.LINGER, 0)
        self.inbox.bind(self._address("orchestrator"))
        self.clients: dict[str, StageClient] = {}
        self.sample_rates: dict[str, int | None] = {}
        self.transport: RayTransport | None = None
        self.ray_deploy = self.local_deploy = deploy
        """The deploy as Ray actors and as stages on this host run it (edges touching a Ray
        stage moved to TCP, bound on each node's address)."""
        self.balancer = ReplicaBalancer(
            {s.name: self.instances(s) for s in deploy.stages if self._on_ray(s)}
        )
        try:
            if any(self._on_ray(s) for s in deploy.stages):
                self.transport = RayTransport(context)
                self.ray_deploy = with_tcp_edges(deploy)
                self.local_deploy = with_zmq_host(self.ray_deploy, self.transport.host)
            for name in deploy.topological_order():
                for instance in self.instances(deploy.stage(name)):
                    self.clients[instance] = self._start(deploy.stage(name), instance)
            self._wait_ready(startup_timeout_s)
        except BaseException:
            self.close()
            raise

    def _address(self, name: str) -> str:
        return f"ipc://{self._tmpdir.name}/{name}.sock"

    def _on_ray(self, spec: StageSpec) -> bool:
        return spec.backend == "ray" and not self.in_process

    def instances(self, spec: StageSpec) -> tuple[str, ...]:
        """The names of the stage's runners (its replicas on Ray; else the stage's name)."""
        return spec.instances if self._on_ray(spec) else (spec.name,)

    @staticmethod
    def stage_of(instance: str) -> str:
        """The stage an instance (`talker#1`, or a stage's own name) runs."""
        return instance.split("#", 1)[0]

    def _start(self, spec: StageSpec, instance: str) -> StageClient:
        if self.in_process or spec.backend == "inprocess":
            return InProcessStageClient(spec, self.local_deploy, self.namespace)
        num_stages = len(self.deploy.stages)
        if self._on_ray(spec):
            assert self.transport is not None  # made in __init__ when a stage is on Ray
            spec = _with_thread_budget(spec, num_stages)
            return RayStageClient(instance, spec, self.ray_deploy, self.namespace, self.transport)
        self._starts[spec.name] = self._starts.get(spec.name, 0) + 1
        return ProcessStageClient(
            _with_thread_budget(spec, num_stages),
            self.local_deploy,
            self.namespace,
            self.context,
            # A socket of its own per start: nothing queued for a dead one reaches the next.
            self._address(f"{spec.name}.{self._starts[spec.name]}"),
            self._address("orchestrator"),
        )

    def sockets(self) -> list[zmq.Socket]:
        """Every socket stages report on: the shared inbox and each Ray replica's own."""
        return [self.inbox] + [s for c in self.clients.values() for s in c.sockets()]

    def restart(self, name: str) -> None:
        """Start stage process `name` afresh (after `reap`), or wait for the actor Ray
        restarts for a Ray instance: it reports `StageReady`, or fails, like at start-up."""
        client = self.clients[name]
        if isinstance(client, RayStageClient):
            client.reattach()
            return
        if isinstance(client, InProcessStageClient):
            raise RuntimeError(f"stage {name!r} runs in this process: it cannot be restarted")
        self.clients[name] = self._start(self.deploy.stage(name), name)

    def reap(self, name: str) -> str:
        """End stage process `name` (SIGKILL unless it has exited), close our ends of it,
        and return how it ended (its traceback when it left one). A Ray instance's actor is
        killed unless it died (Ray restarts it); its sockets stay for the restarted one."""
        client = self.clients[name]
        if isinstance(client, RayStageClient):
            return client.reap()
        if client.exit_code() is None and isinstance(client, ProcessStageClient):
            client.kill()
        failure = client.failure()
        try:
            client.close(timeout=5.0)
        except Exception:  # its resources are ours to drop whatever it did
            logger.exception("closing stage %s", name)
        return failure

    def release_request(self, request_id: str) -> int:
        """Unlink every shared-memory payload of `request_id` (a request that failed
        because a stage died: what was sent to or by that stage has no reader left)."""
        return sum(connector.cleanup(request_id) for connector in self._shm)

    def _wait_ready(self, timeout_s: float) -> None:
        waiting = set(self.clients)
        deadline = time.monotonic() + timeout_s
        while waiting:
            events = self.poll_clients()
            if self.inbox.poll(0 if events else READY_POLL_MS):
                events += self.drain_inbox()
            for event in events:
                if isinstance(event, StageReady):
                    waiting.discard(event.stage)
                    self.sample_rates[self.stage_of(event.stage)] = event.sample_rate
                elif isinstance(event, StageFatal):
                    raise ChildError(
                        f"stage {event.stage!r} failed to start: {event.message}\n"
                        f"{self.clients[event.stage].failure()}"
                    )
            for name in waiting:
                if self.clients[name].exit_code() is not None:
                    raise ChildError(
                        f"stage {name!r} exited during start-up: {self.clients[name].failure()}"
                    )
            if time.monotonic() > deadline:
                raise TimeoutError(f"stages {sorted(waiting)} not ready within {timeout_s:g} s")

    # -- talking to the stages ----------------------------------------------------------------
    def send(self, stage: str, msg: ToStage) -> None:
        """Send `msg` to an instance, or to a stage: for a replicated one, to the replica
        serving the message's request (chosen at its `SubmitRequest`). A message for a
        request no replica serves (it ended, or its replica died) goes nowhere."""
        if stage in self.clients:
            self.clients[stage].send(msg)
            return
        request_id = getattr(msg, "request_id", None)
        if request_id is None:  # not a request's: every replica gets it
            for instance in self.balancer.instances(stage):
                self.clients[instance].send(msg)
            return
        if isinstance(msg, SubmitRequest):
            instance = self.balancer.assign(stage, request_id)
        else:
            instance = self.balancer.assigned(stage, request_id)
        if instance is not None:
            self.clients[instance].send(msg)

    def poll_clients(self) -> list[FromStage]:
        """In-process stages: run a step each and collect what they report."""
        events: list[FromStage] = []
        for client in self.clients.values():
            events += client.poll()
        return events

    def drain_inbox(self) -> list[FromStage]:
        """Everything stage processes reported so far (never waits)."""
        return drain_reports(self.inbox)

    def busy(self) -> bool:
        return any(c.busy() for c in self.clients.values())

    def exit_codes(self) -> dict[str, int]:
        """Stages whose process has ended, with its exit code."""
        codes = {name: client.exit_code() for name, client in self.clients.items()}
        return {name: code for name, code in codes.items() if code is not None}

    def close(self) -> None:
        """Stop every stage: all are asked first, then each is waited for (they wind down
        together), then whatever a stage left in shared memory is unlinked."""
        for client in self.clients.values():
            client.request_stop()
        for client in self.clients.values():
            try:
                client.close()
            except Exception:  # keep closing the others
                logger.exception("closing stage %s", client.name)
        self._cleanup_connectors()
        self.inbox.close(linger=0)
        if self.transport is not None:
            self.transport.close()
        self._tmpdir.cleanup()

    def _cleanup_connectors(self) -> None:
        """Drop any buffer a crashed or killed stage left behind (shared memory above all)."""
        for connector in self._shm:
            connector.cleanup_all()
            connector.close()


def _shm_connectors(deploy: DeploySpec, namespace: str) -> list[Connector]:
    """The deploy's shared-memory connectors, as this process reaches them (cleanup only)."""
    return [
        make_connector(name, spec.kind, spec.options, namespace=namespace)
        for name, spec in deploy.connectors.items()
        if spec.kind == "shm"
    ]


def _with_thread_budget(spec: StageSpec, num_stages: int) -> StageSpec:
    """Stage processes share the cores: unless the deploy file says otherwise, each gets
    an equal share of torch threads (DESIGN.md §10: oversubscribing slows everyone)."""
    if "num_threads" in spec.engine_args:
        return spec
    threads = max(1, (os.cpu_count() or 1) // num_stages)
    if spec.ray is not None:  # an actor gets the CPUs Ray reserves for it
        threads = max(1, int(spec.ray.num_cpus))
    return dataclasses.replace(spec, engine_args={**spec.engine_args, "num_threads": threads})
