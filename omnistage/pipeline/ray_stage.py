"""Running a stage on Ray: `RayStageClient`, the orchestrator's handle on one Ray actor.

A stage with `backend: ray` runs as one actor per replica, placed by Ray from the
stage's `ray` options (CPUs, GPUs, custom resources, node labels). The actor runs
the same stage loop as a stage process (`serve_stage`) on a thread its constructor
starts, and speaks the same msgspec protocol with the orchestrator, over TCP::

    orchestrator PUSH (bound) ── SubmitRequest, DeliverPayload, ... ──▶ actor PULL
    orchestrator PULL (bound) ◀── StageReady, StageOutput, ... ──────── actor PUSH

Each actor has its own pair of sockets, bound on the orchestrator node's address
(`RayTransport`); so the orchestrator knows which replica reported what. The sockets
are authenticated and encrypted with ZeroMQ CURVE: the orchestrator's side admits
only the pipeline's client key (a ZAP handler), and both key pairs are made per
pipeline and reach the actors only through Ray (the actor's arguments).

Payload edges that touch a Ray stage go over the TCP connector (`with_tcp_edges`:
shared memory cannot cross machines), each producer binding its own node's address
(`with_zmq_host`). A replica whose actor dies fails its requests; Ray restarts the
actor (`max_restarts`), whose constructor runs the stage loop again, and the replica
rejoins when it reports ready. Ray is an optional dependency: it is imported only
when a deploy has a Ray stage.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import traceback
from typing import Any

import msgspec
import zmq

from omnistage.pipeline.connectors.zmq_tcp import SECRET_ENV
from omnistage.pipeline.deploy import ConnectorSpec, DeploySpec, StageSpec
from omnistage.pipeline.messages import (
    Busy,
    FromStage,
    Pong,
    Shutdown,
    StageFatal,
    StageReady,
    StageStats,
    ToStage,
    drain_reports,
    to_stage_encoder,
)
from omnistage.pipeline.stage_process import StageClient, serve_stage

logger = logging.getLogger(__name__)
TCP_CONNECTOR = "tcp@ray"
"""The connector edges touching a Ray stage use unless they name a zmq one (not a name
a deploy file can declare, so it never shadows one)."""
ZAP_DOMAIN = "omnistage"
WATCH_INTERVAL_S = 0.1
"""How often the orchestrator asks Ray whether an actor's stage loop has ended."""
_INSTANCE_EVENTS = (StageReady, StageFatal, Pong, Busy, StageStats)
"""Events about the runner rather than a request: they name the replica (`talker#1`)."""


def import_ray() -> Any:
    """The `ray` module, or an ImportError that says which setting needs it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            "a stage with backend: ray needs the package 'ray' (pip install 'omnistage[ray]'); "
            "use backend: process to run it without Ray"
        ) from exc
    return ray


def node_address() -> str:
    """The address of the Ray node this process runs on (the one it was started with:
    127.0.0.1 for a cluster on loopback)."""
    ray = import_ray()
    if not ray.is_initialized():
        ray.init()
    node_id = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node.get("NodeID") == node_id:
            return str(node["NodeManagerAddress"])
    return str(ray.util.get_node_ip_address())


def with_tcp_edges(deploy: DeploySpec) -> DeploySpec:
    """`deploy` with every payload edge that touches a Ray stage on a zmq connector: the
    implicit `tcp@ray` one (carrying $OMNISTAGE_CONNECTOR_SECRET, if set, to every node)
    unless the edge names a zmq connector."""
    on_ray = {s.name for s in deploy.stages if s.backend == "ray"}
    connectors = deploy.connectors

    def moved(edge: Any) -> bool:
        touches = edge.src in on_ray or edge.dst in on_ray
        return touches and edge.connector is not None and connectors[edge.connector].kind != "zmq"

    if not any(moved(e) for e in deploy.edges):
        return deploy
    secret = os.environ.get(SECRET_ENV)
    options = {} if secret is None else {"secret": secret}
    edges = tuple(
        dataclasses.replace(e, connector=TCP_CONNECTOR) if moved(e) else e for e in deploy.edges
    )
    tcp = ConnectorSpec(TCP_CONNECTOR, "zmq", options)
    return dataclasses.replace(deploy, edges=edges, connectors={**connectors, TCP_CONNECTOR: tcp})


def with_zmq_host(deploy: DeploySpec, host: str) -> DeploySpec:
    """`deploy` where each zmq connector that names no `host` binds `host` (this node's
    address: its consumers may be on other nodes)."""
    connectors = {
        name: spec
        if spec.kind != "zmq" or "host" in spec.options
        else ConnectorSpec(name, spec.kind, {**spec.options, "host": host})
        for name, spec in deploy.connectors.items()
    }
    return dataclasses.replace(deploy, connectors=connectors)


class CurveKeys(msgspec.Struct, frozen=True):
    """What an actor needs to reach the orchestrator: its public key and the client pair."""

    server_public: bytes
    client_public: bytes
    client_secret: bytes


class _OnlyKey:
    """ZAP credentials provider: admits the one client key of this pipeline."""

    def __init__(self, key: bytes) -> None:
        self.key = key

    def callback(self, domain: str, key: bytes) -> bool:
        return domain == ZAP_DOMAIN and key == self.key


class RayTransport:
    """The orchestrator's side of the sockets Ray stages talk over: CURVE keys made for this
    pipeline, the ZAP handler that admits only its client key, and the address to bind
    (this node's, as Ray knows it)."""

    def __init__(self, context: zmq.Context) -> None:
        from zmq.auth.thread import ThreadAuthenticator

        self.context = context
        self.host = node_address()
        self._public, self._secret = zmq.curve_keypair()
        client_public, client_secret = zmq.curve_keypair()
        self.keys = CurveKeys(self._public, client_public, client_secret)
        self._auth = ThreadAuthenticator(context)
        self._auth.start()
        self._auth.configure_curve_callback(ZAP_DOMAIN, _OnlyKey(client_public))

    def bind(self, kind: int) -> tuple[zmq.Socket, str]:
        """A CURVE server socket of `kind` bound on a free port; and its address."""
        sock = self.context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.curve_secretkey, sock.curve_publickey = self._secret, self._public
        sock.curve_server = True
        sock.zap_domain = ZAP_DOMAIN.encode()
        if kind == zmq.PUSH:
            sock.setsockopt(zmq.SNDHWM, 0)  # no limit: a send fails only with no peer
        host = f"[{self.host}]" if ":" in self.host else self.host
        if ":" in self.host:
            sock.setsockopt(zmq.IPV6, 1)
        sock.bind(f"tcp://{host}:0")
        return sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def close(self) -> None:
        self._auth.stop()


def _client_socket(context: zmq.Context, kind: int, keys: CurveKeys, address: str) -> zmq.Socket:
    sock = context.socket(kind)
    sock.curve_serverkey = keys.server_public
    sock.curve_publickey, sock.curve_secretkey = keys.client_public, keys.client_secret
    if address.startswith("tcp://["):
        sock.setsockopt(zmq.IPV6, 1)
    sock.connect(address)
    return sock


@dataclasses.dataclass(frozen=True)
class ActorWiring:
    """What a stage actor needs to run its stage and reach the orchestrator."""

    spec: StageSpec
    deploy: DeploySpec
    namespace: str
    in_address: str
    out_address: str
    keys: CurveKeys


class StageActor:
    """The body of a Ray stage actor. Its constructor starts the stage loop on a thread, so an
    actor Ray restarts serves (and reports ready) again by itself; `wait` returns when the
    loop ends: "" after `Shutdown`, else the traceback that ended it."""

    def __init__(self, wiring: ActorWiring) -> None:
        self._done = threading.Event()
        self._error = ""
        threading.Thread(
            target=self._serve, args=(wiring,), name="omnistage-stage", daemon=True
        ).start()

    def _serve(self, wiring: ActorWiring) -> None:
        context = zmq.Context()
        inbox = _client_socket(context, zmq.PULL, wiring.keys, wiring.in_address)
        outbox = _client_socket(context, zmq.PUSH, wiring.keys, wiring.out_address)
        outbox.setsockopt(zmq.LINGER, 2000)
        try:
            deploy = with_zmq_host(wiring.deploy, node_address())
            serve_stage(wiring.spec, deploy, wiring.namespace, inbox, outbox, lambda: True)
        except BaseException:
            self._error = traceback.format_exc()
        finally:
            inbox.close(linger=0)
            outbox.close()
            context.term()
            self._done.set()

    def wait(self) -> str:
        self._done.wait()
        return self._error

    def pid(self) -> int:
        return os.getpid()


_actor_class: Any = None


def _remote_class() -> Any:
    global _actor_class
    if _actor_class is None:
        _actor_class = import_ray().remote(StageActor)
    return _actor_class


class RayStageClient(StageClient):
    """One replica (`instance`) of a Ray stage: its actor and the two sockets to it."""

    def __init__(
        self,
        instance: str,
        spec: StageSpec,
        deploy: DeploySpec,
        namespace: str,
        transport: RayTransport,
    ) -> None:
        self.ray = import_ray()
        self.name = instance
        options = spec.ray
        if options is None:
            raise ValueError(f"stage {spec.name!r}: backend ray without ray options")
        self.push, in_address = transport.bind(zmq.PUSH)
        self.pull, out_address = transport.bind(zmq.PULL)
        self._stop_sent = False
        self._pid = 0
        self._ended: tuple[int, str] | None = None
        self._died = False
        self._next_watch = 0.0
        try:
            self.actor = (
                _remote_class()
                .options(
                    num_cpus=options.num_cpus,
                    num_gpus=options.num_gpus,
                    resources=dict(options.resources) or None,
                    label_selector=dict(options.labels) or None,
                    max_restarts=options.max_restarts,
                    max_task_retries=0,
                    max_concurrency=2,  # `wait` runs beside the constructor's thread
                    name=None,
                )
                .remote(
                    ActorWiring(spec, deploy, namespace, in_address, out_address, transport.keys)
                )
            )
            self._watch = self.actor.wait.remote()
        except BaseException:
            self.push.close(linger=0)
            self.pull.close(linger=0)
            raise

    @property
    def pid(self) -> int:
        """The actor's process id, from its `StageReady` (0 until then)."""
        return self._pid

    def sockets(self) -> list[zmq.Socket]:
        return [self.pull]

    def send(self, msg: ToStage) -> None:
        """Never waits: with no peer (the actor died, or Ray is restarting it) the message
        is dropped, as for a stage process."""
        try:
            self.push.send(to_stage_encoder.encode(msg), zmq.NOBLOCK, copy=False)
        except zmq.Again:
            logger.warning("stage %s: not connected, %s dropped", self.name, type(msg).__name__)

    def poll(self) -> list[FromStage]:
        """What the actor reported so far; events about the runner name the replica."""
        events = drain_reports(self.pull)
        for event in events:
            if isinstance(event, _INSTANCE_EVENTS):
                event.stage = self.name
            if isinstance(event, StageReady):
                self._pid = event.pid
        return events

    def exit_code(self) -> int | None:
        """None while the actor's stage loop runs; 0 after a `Shutdown`, 1 when it failed,
        -1 when the actor died (Ray restarts it, up to `max_restarts`)."""
        now = time.monotonic()
        if self._ended is None and now >= self._next_watch:
            self._next_watch = now + WATCH_INTERVAL_S
            ready, _ = self.ray.wait([self._watch], timeout=0)
            if ready:
                self._ended = self._outcome()
        return None if self._ended is None else self._ended[0]

    def _outcome(self) -> tuple[int, str] | None:
        """How the watched loop ended; None while Ray restarts the actor we reattached to
        (a call to a restarting actor fails at once: it is asked again)."""
        try:
            error = self.ray.get(self._watch)
        except self.ray.exceptions.RayActorError as exc:
            if self._pid == 0 and isinstance(exc, self.ray.exceptions.ActorUnavailableError):
                logger.debug("stage %s: actor not back yet (%s)", self.name, exc)
                self._watch = self.actor.wait.remote()
                return None
            self._died = True
            return -1, f"its Ray actor died: {exc}"
        except self.ray.exceptions.RayError as exc:
            return 1, f"Ray: {exc}"
        return (1, error) if error else (0, "")

    def failure(self) -> str:
        return "" if self._ended is None else self._ended[1]

    def kill(self) -> None:
        """Kill the actor (a hung one); Ray restarts it unless its restarts are spent."""
        self.ray.kill(self.actor, no_restart=False)

    def reap(self) -> str:
        """The replica failed: kill its actor unless it died already (Ray restarts it
        either way) and say how it ended. Its sockets stay: the restarted actor reconnects."""
        if not self._died:
            self.kill()
        return self.failure() or "its actor was killed"

    def reattach(self) -> None:
        """Wait for the actor Ray restarts (its constructor reports `StageReady` again)."""
        self._ended, self._died, self._pid = None, False, 0
        self._next_watch = 0.0
        self._watch = self.actor.wait.remote()

    def request_stop(self) -> None:
        if not self._stop_sent:
            self._stop_sent = True
            self.send(Shutdown())

    def close(self, timeout: float = 10.0) -> None:
        """Stop the stage loop (waiting up to `timeout`), then end the actor for good."""
        self.request_stop()
        try:
            if self._ended is None:
                self.ray.wait([self._watch], timeout=timeout)
            self.ray.kill(self.actor, no_restart=True)
        finally:
            self.push.close(linger=0)
            self.pull.close(linger=0)
