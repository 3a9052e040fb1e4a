"""The connector interface: how payloads travel from a producing stage to a consuming one.

A connector moves bulk data (hidden states, codec tokens, latents) between stages
while only a small ``PayloadHandle`` goes over the control plane::

    producer stage                 orchestrator               consumer stage
    handle = conn.put(key, p)  ──▶  forwards handle  ──▶  p = conn.get(handle)
              │                                                 ▲
              └────────── bytes: in-process / shm / TCP ────────┘

Contract shared by every kind (tests hold all of them to it):

- ``put`` validates the payload against the schema and stores a packed copy;
  later changes to the caller's tensors do not reach the consumer.
- ``get`` is consume-once: it returns a fresh copy and frees what ``put`` held.
  A key this process has seen consumed or cleaned up raises ``ValueError`` at
  once; a key that is not (yet) there raises ``TimeoutError`` after the timeout
  (default: the connector's ``timeout_s``) — a consumer never waits forever.
- ``cleanup(request_id)`` drops every buffer of the request, any edge, any chunk,
  that this process can reach. It is idempotent and is called however a request
  ends, so ``num_pending()`` returns to zero (invariant 8).
"""

from __future__ import annotations

import re
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import msgspec

from omnistage.core.payload import Payload

DEFAULT_TIMEOUT_S = 30.0
# No "_": shared-memory segment names are "omni_{namespace}_...", and a prefix must not match
# another namespace.
_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9]{1,32}$")
# How many consumed/cleaned keys a connector remembers, to tell "gone" from "not yet there".
_MAX_TOMBSTONES = 65536


class PayloadHandle(msgspec.Struct, frozen=True):
    """Where a stored payload can be fetched; small, sent from producer to consumer."""

    connector: str
    """The connector's name in the deploy file."""
    key: str
    """``payload_key(request_id, edge, chunk_index)``."""
    location: str
    """Connector-specific: shm segment name, ``tcp://host:port`` of the producer, "" in-process."""
    nbytes: int
    """Length of the packed payload."""


class ConnectorHealth(msgspec.Struct, frozen=True):
    """A connector's self-report."""

    ok: bool
    detail: str
    pending: int


def payload_key(request_id: str, edge: str, chunk_index: int) -> str:
    """The key of one payload: ``"{request_id}/{edge}/{chunk_index}"``.

    `edge` is ``"producer->consumer"`` and may not contain "/", so the request id
    (which may) is everything before the last two slashes.
    """
    if not isinstance(request_id, str) or not request_id:
        raise ValueError(f"payload_key: request_id must be a non-empty str, got {request_id!r}")
    if not isinstance(edge, str) or not edge or "/" in edge:
        raise ValueError(f"payload_key: edge must be a non-empty str without '/', got {edge!r}")
    if type(chunk_index) is not int or chunk_index < 0:
        raise ValueError(f"payload_key: chunk_index must be an int >= 0, got {chunk_index!r}")
    return f"{request_id}/{edge}/{chunk_index}"


def parse_payload_key(key: str) -> tuple[str, str, int]:
    """Inverse of ``payload_key``: ``(request_id, edge, chunk_index)``; ValueError if malformed."""
    parts = key.rsplit("/", 2) if isinstance(key, str) else []
    if len(parts) != 3 or not parts[0] or not parts[1] or not parts[2].isdigit():
        raise ValueError(f"{key!r} is not a payload key made by payload_key()")
    return parts[0], parts[1], int(parts[2])


def gone_error(key: str, connector: str) -> ValueError:
    return ValueError(f"payload {key!r} on connector {connector!r} was consumed or cleaned up")


class Tombstones:
    """A bounded, thread-safe memory of keys that were consumed or cleaned up."""

    def __init__(self, capacity: int = _MAX_TOMBSTONES) -> None:
        self._keys: OrderedDict[str, None] = OrderedDict()
        self._capacity = capacity
        self._lock = threading.Lock()

    def add(self, key: str) -> None:
        with self._lock:
            self._keys[key] = None
            self._keys.move_to_end(key)
            if len(self._keys) > self._capacity:
                self._keys.popitem(last=False)

    def discard(self, key: str) -> None:
        with self._lock:
            self._keys.pop(key, None)

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._keys


class Connector(ABC):
    """Transport of payloads between stages; one instance per (process, connector name).

    Subclasses are registered by kind in ``connectors.__init__`` and built with
    ``make_connector``. Each declares the deploy-file options it accepts in
    ``OPTIONS``; every kind accepts ``timeout_s`` (default ``get`` timeout).
    """

    OPTIONS: frozenset[str] = frozenset({"timeout_s"})

    def __init__(self, name: str, options: Mapping[str, Any], *, namespace: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"connector name must be a non-empty str, got {name!r}")
        if not isinstance(namespace, str) or not _NAMESPACE_RE.match(namespace):
            raise ValueError(
                f"connector {name!r}: namespace must be 1-32 letters or digits, got {namespace!r}"
            )
        unknown = sorted(set(options) - self.OPTIONS)
        if unknown:
            raise ValueError(
                f"connector {name!r}: unknown option {unknown[0]!r}; "
                f"known: {', '.join(sorted(self.OPTIONS))}"
            )
        timeout = options.get("timeout_s", DEFAULT_TIMEOUT_S)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ValueError(f"connector {name!r}: option 'timeout_s' must be > 0, got {timeout!r}")
        self.name = name
        self.namespace = namespace
        self.timeout_s = float(timeout)

    @abstractmethod
    def put(self, key: str, payload: Payload) -> PayloadHandle:
        """Producer side: validate `payload`, store a packed copy under `key`, return its handle.

        ValueError if `key` is not a ``payload_key`` or is already held, PayloadError
        (a ValueError) if the payload is off-schema.
        """

    @abstractmethod
    def get(self, handle: PayloadHandle, timeout: float | None = None) -> Payload:
        """Consumer side: fetch and free the payload of `handle` (consume-once).

        `timeout` None means ``self.timeout_s``. TimeoutError naming the key if it
        is not available in time; ValueError if it is known to be consumed or
        cleaned up, or the handle belongs to another connector.
        """

    @abstractmethod
    def cleanup(self, request_id: str) -> int:
        """Drop every buffer of `request_id` this process can reach; return how many. Idempotent."""

    @abstractmethod
    def cleanup_all(self) -> int:
        """Drop every buffer of this connector (name and namespace) this process can reach."""

    @abstractmethod
    def num_pending(self) -> int:
        """Buffers currently held (stored and not yet consumed or cleaned up)."""

    @abstractmethod
    def health(self) -> ConnectorHealth:
        """Whether the connector can move data now, and how many buffers it holds."""

    @abstractmethod
    def close(self) -> None:
        """Release sockets and threads and drop what this instance holds. Idempotent."""

    def _timeout(self, timeout: float | None) -> float:
        return self.timeout_s if timeout is None else float(timeout)

    def _check_handle(self, handle: PayloadHandle) -> None:
        if not isinstance(handle, PayloadHandle):
            raise TypeError(f"connector {self.name!r}: expected a PayloadHandle, got {handle!r}")
        if handle.connector != self.name:
            raise ValueError(
                f"handle for payload {handle.key!r} belongs to connector "
                f"{handle.connector!r}, not {self.name!r}"
            )

    def __enter__(self) -> Connector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, namespace={self.namespace!r})"
