"""The TCP connector (ZeroMQ, pull model): for stages on other hosts.

The producer keeps packed payloads in memory and serves them; the consumer
fetches by key::

    consumer DEALER ── [nonce, key] ──────────────▶ producer ROUTER (server thread)
                    ◀── [nonce, b"ok", payload] ──   pops the buffer: consume-once
                    ◀── [nonce, b"missing"] ───────   never put (yet): retry until timeout
                    ◀── [nonce, b"gone"] ──────────   consumed or cleaned up: ValueError

The server thread starts on the first ``put`` and binds ``tcp://{host}:{port}``
(port 0 picks a free port); the handle's ``location`` is the bound address.
Each reply carries the request's nonce, so a late reply to a request that timed
out is never taken for the answer to a later one; after a timeout the DEALER
is closed and rebuilt so nothing queued for a dead producer is replayed.
``cleanup`` drops buffers held by the producer in this process.

Authentication: with a shared secret (option ``secret``, else the environment's
``OMNISTAGE_CONNECTOR_SECRET``) every request and every reply carries an HMAC-SHA256 of
its frames as a last frame; a producer answers a request whose MAC is wrong or missing
with ``denied`` and nothing else, and a consumer refuses a reply whose MAC is wrong (a
``ValueError`` naming the producer). A producer bound to anything but a loopback
address needs a secret: a payload is a request's hidden states or audio, not for
whoever reaches the port.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import itertools
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

import zmq

from omnistage.core.payload import Payload, pack_payload, unpack_payload
from omnistage.pipeline.connectors.base import (
    Connector,
    ConnectorHealth,
    PayloadHandle,
    Tombstones,
    gone_error,
    parse_payload_key,
)

_OK, _MISSING, _GONE, _DENIED = b"ok", b"missing", b"gone", b"denied"
_START_TIMEOUT_S = 10.0
SECRET_ENV = "OMNISTAGE_CONNECTOR_SECRET"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Frames:
    """Signs and checks message frames with a shared secret (no secret: plain frames)."""

    def __init__(self, secret: bytes | None) -> None:
        self.secret = secret

    def _mac(self, kind: bytes, frames: list[Any]) -> bytes:
        mac = hmac.new(self.secret or b"", kind, hashlib.sha256)
        for frame in frames:
            data = memoryview(frame.buffer if isinstance(frame, zmq.Frame) else frame)
            mac.update(len(data).to_bytes(8, "little"))
            mac.update(data)
        return mac.digest()

    def sign(self, kind: bytes, frames: list[Any]) -> list[Any]:
        return frames if self.secret is None else [*frames, self._mac(kind, frames)]

    def check(self, kind: bytes, frames: list[Any]) -> list[Any] | None:
        """The frames without their MAC, or None when it is wrong or missing."""
        if self.secret is None:
            return frames
        if not frames:
            return None
        *body, mac = frames
        given = mac.bytes if isinstance(mac, zmq.Frame) else mac
        return body if hmac.compare_digest(given, self._mac(kind, body)) else None


class ZmqConnector(Connector):
    """Connector kind ``zmq``; options ``host``, ``port``, ``advertise_host``, ``timeout_s``.

    ``advertise_host`` (default: ``host``) is the host name put in handles, for a
    producer bound to a wildcard address such as 0.0.0.0. DEALER sockets are cached
    per thread and per producer address; call ``get`` from any thread, but ``close``
    only once no ``get`` is running.
    """

    OPTIONS = frozenset({"timeout_s", "host", "port", "advertise_host", "secret"})

    def __init__(self, name: str, options: Mapping[str, Any], *, namespace: str) -> None:
        super().__init__(name, options, namespace=namespace)
        self._host = options.get("host", "127.0.0.1")
        self._port = options.get("port", 0)
        self._advertise = options.get("advertise_host", self._host)
        for opt, value in (("host", self._host), ("advertise_host", self._advertise)):
            if not isinstance(value, str) or not value:
                raise ValueError(f"connector {name!r}: option {opt!r} must be a host name")
        if type(self._port) is not int or not 0 <= self._port <= 65535:
            raise ValueError(
                f"connector {name!r}: option 'port' must be 0-65535, got {self._port!r}"
            )
        secret = options.get("secret", os.environ.get(SECRET_ENV))
        if secret is not None and (not isinstance(secret, str) or len(secret) < 16):
            raise ValueError(f"connector {name!r}: option 'secret' must be 16 characters or more")
        if secret is None and not _is_loopback(self._host):
            raise ValueError(
                f"connector {name!r}: binding {self._host} (not loopback) needs a shared secret: "
                f"option 'secret' or ${SECRET_ENV}, the same on every host of the pipeline"
            )
        self._frames = _Frames(secret.encode() if secret is not None else None)
        self._ctx = zmq.Context()
        self._lock = threading.Lock()  # guards _buffers, _dealers, server start
        self._buffers: dict[str, bytes] = {}
        self._tombstones = Tombstones()
        self._endpoint: str | None = None
        self._thread: threading.Thread | None = None
        self._wake_addr = f"inproc://omnistage-wake-{id(self)}"
        self._local = threading.local()
        self._dealers: list[zmq.Socket] = []
        self._nonces = itertools.count()
        self._closed = False

    # ---- producer side ------------------------------------------------------------------

    def put(self, key: str, payload: Payload) -> PayloadHandle:
        self._check_open()
        parse_payload_key(key)
        packed = pack_payload(payload, where=f"connector {self.name!r} put {key!r}")
        endpoint = self._ensure_server()
        with self._lock:
            if key in self._buffers:
                raise ValueError(f"payload {key!r} is already held by connector {self.name!r}")
            self._buffers[key] = packed
            self._tombstones.discard(key)
        return PayloadHandle(self.name, key, endpoint, len(packed))

    def _ensure_server(self) -> str:
        with self._lock:
            if self._thread is None:
                ready = threading.Event()
                result: list[Any] = []
                self._thread = threading.Thread(
                    target=self._serve, args=(ready, result), name=f"zmq-{self.name}", daemon=True
                )
                self._thread.start()
                if not ready.wait(_START_TIMEOUT_S) or isinstance(result[0], Exception):
                    error = result[0] if result else "timed out"
                    self._thread = None
                    raise RuntimeError(f"connector {self.name!r}: cannot serve: {error}")
                self._endpoint = result[0]
            assert self._endpoint is not None
            return self._endpoint

    def _serve(self, ready: threading.Event, result: list[Any]) -> None:
        """Server thread: answer fetches until woken by close()."""
        router = self._ctx.socket(zmq.ROUTER)
        wake = self._ctx.socket(zmq.PAIR)
        router.linger = wake.linger = 0
        try:
            router.bind(f"tcp://{self._host}:{self._port or '*'}")
            wake.bind(self._wake_addr)
        except zmq.ZMQError as exc:
            router.close()
            wake.close()
            result.append(exc)
            ready.set()
            return
        port = router.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1]
        result.append(f"tcp://{self._advertise}:{port}")
        ready.set()
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(wake, zmq.POLLIN)
        try:
            while wake not in dict(poller.poll()):
                identity, *frames = router.recv_multipart()
                request = self._frames.check(b"request", frames)
                if request is None or len(request) != 2:  # [nonce, key]; else not ours
                    router.send_multipart([identity, frames[0] if frames else b"", _DENIED])
                    continue
                reply = self._frames.sign(b"reply", [request[0], *self._answer(request[1])])
                router.send_multipart([identity, *reply], copy=False)
        finally:
            router.close()
            wake.close()

    def _answer(self, raw_key: bytes) -> list[bytes]:
        key = raw_key.decode("utf-8", "replace")
        with self._lock:
            packed = self._buffers.pop(key, None)
            if packed is not None:
                self._tombstones.add(key)
        if packed is not None:
            return [_OK, packed]
        return [_GONE if key in self._tombstones else _MISSING]

    # ---- consumer side ------------------------------------------------------------------

    def get(self, handle: PayloadHandle, timeout: float | None = None) -> Payload:
        self._check_open()
        self._check_handle(handle)
        key, location = handle.key, handle.location
        if not location.startswith("tcp://"):
            raise ValueError(f"handle for {key!r} has location {location!r}, not tcp://host:port")
        wait_s = self._timeout(timeout)
        deadline, delay, answered = time.monotonic() + wait_s, 0.001, False
        while True:
            reply = self._request(location, key, deadline)
            if reply is not None:
                answered = True
                status = reply[0].bytes
                if status == _DENIED:
                    raise ValueError(
                        f"connector {self.name!r}: producer {location} refused the fetch of "
                        f"{key!r}: its shared secret is not ours (option 'secret', ${SECRET_ENV})"
                    )
                if status == _OK and len(reply) == 2:
                    where = f"connector {self.name!r} get {key!r}"
                    return unpack_payload(reply[1].buffer, where=where)
                if status == _GONE:
                    raise gone_error(key, self.name)
            remaining = deadline - time.monotonic()
            if reply is None or remaining <= 0:
                why = "not held there" if answered else "no answer"
                raise TimeoutError(
                    f"payload {key!r} not available from producer {location} "
                    f"within {wait_s:g}s ({why})"
                )
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.05)

    def _request(self, location: str, key: str, deadline: float) -> list[zmq.Frame] | None:
        """Send one fetch and wait for its reply; None (and a fresh socket next time) on timeout."""
        sock = self._dealer(location)
        nonce = next(self._nonces).to_bytes(8, "little")
        sock.send_multipart(self._frames.sign(b"request", [nonce, key.encode()]))
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        while True:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0 or not poller.poll(remaining_ms):
                self._drop_dealer(location)
                return None
            frames = sock.recv_multipart(copy=False)
            if frames[0].bytes != nonce:  # a late reply to a request that timed out
                continue
            if len(frames) == 2 and frames[1].bytes == _DENIED:
                return frames[1:]
            reply = self._frames.check(b"reply", frames)
            if reply is None:
                raise ValueError(
                    f"connector {self.name!r}: the reply from {location} for {key!r} failed "
                    f"authentication (a different shared secret, or not a producer of ours)"
                )
            return reply[1:]

    def _dealer(self, location: str) -> zmq.Socket:
        dealers = self._local.__dict__.setdefault("dealers", {})
        sock = dealers.get(location)
        if sock is None:
            sock = self._ctx.socket(zmq.DEALER)
            sock.linger = 0
            sock.connect(location)
            dealers[location] = sock
            with self._lock:
                self._dealers.append(sock)
        return sock

    def _drop_dealer(self, location: str) -> None:
        sock = self._local.__dict__.get("dealers", {}).pop(location, None)
        if sock is not None:
            with self._lock:
                self._dealers.remove(sock)
            sock.close(linger=0)

    # ---- both sides ---------------------------------------------------------------------

    def cleanup(self, request_id: str) -> int:
        with self._lock:
            keys = [k for k in self._buffers if parse_payload_key(k)[0] == request_id]
            for key in keys:
                del self._buffers[key]
                self._tombstones.add(key)
        return len(keys)

    def cleanup_all(self) -> int:
        with self._lock:
            keys = list(self._buffers)
            self._buffers.clear()
        for key in keys:
            self._tombstones.add(key)
        return len(keys)

    def num_pending(self) -> int:
        with self._lock:
            return len(self._buffers)

    def health(self) -> ConnectorHealth:
        if self._closed:
            return ConnectorHealth(False, "closed", self.num_pending())
        if self._thread is None:
            return ConnectorHealth(True, "producer not started", self.num_pending())
        alive = self._thread.is_alive()
        detail = f"serving at {self._endpoint}" if alive else "server thread died"
        return ConnectorHealth(alive, detail, self.num_pending())

    def close(self) -> None:
        """Stop the server thread, close every socket (linger 0) and drop held buffers."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None and self._thread.is_alive():
            waker = self._ctx.socket(zmq.PAIR)
            waker.linger = 0
            waker.connect(self._wake_addr)
            waker.send(b"")
            self._thread.join(timeout=5.0)
            waker.close()
        with self._lock:
            dealers, self._dealers = self._dealers, []
            self._buffers.clear()
        for sock in dealers:
            sock.close(linger=0)
        self._ctx.destroy(linger=0)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"connector {self.name!r} is closed")
