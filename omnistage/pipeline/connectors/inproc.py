"""The in-process connector: payloads in a process-global store, for stages in one process.

Producer and consumer build their own ``InProcessConnector`` with the same
namespace and name; both reach the same ``_Store``. Payloads are stored packed,
so validation and copy semantics are those of the other connectors: the
consumer never aliases the producer's tensors.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Mapping
from typing import Any

from omnistage.core.payload import Payload, pack_payload, unpack_payload
from omnistage.pipeline.connectors.base import (
    Connector,
    ConnectorHealth,
    PayloadHandle,
    Tombstones,
    gone_error,
    parse_payload_key,
)


class _Store:
    """Packed payloads of one (namespace, connector name), shared by its instances."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.items: dict[str, tuple[int, bytes]] = {}  # key -> (owner instance id, packed)
        self.tombstones = Tombstones()
        self.refs = 0


_STORES: dict[tuple[str, str], _Store] = {}
_STORES_LOCK = threading.Lock()
_instance_ids = itertools.count()


class InProcessConnector(Connector):
    """Connector kind ``inproc``; ``location`` is always ""."""

    def __init__(self, name: str, options: Mapping[str, Any], *, namespace: str) -> None:
        super().__init__(name, options, namespace=namespace)
        self._id = next(_instance_ids)
        self._closed = False
        with _STORES_LOCK:
            self._store = _STORES.setdefault((namespace, name), _Store())
            self._store.refs += 1

    def put(self, key: str, payload: Payload) -> PayloadHandle:
        self._check_open()
        parse_payload_key(key)
        packed = pack_payload(payload, where=f"connector {self.name!r} put {key!r}")
        store = self._store
        with store.cond:
            if key in store.items:
                raise ValueError(f"payload {key!r} is already held by connector {self.name!r}")
            store.items[key] = (self._id, packed)
            store.tombstones.discard(key)
            store.cond.notify_all()
        return PayloadHandle(self.name, key, "", len(packed))

    def get(self, handle: PayloadHandle, timeout: float | None = None) -> Payload:
        self._check_open()
        self._check_handle(handle)
        key, store = handle.key, self._store
        wait_s = self._timeout(timeout)
        deadline = time.monotonic() + wait_s
        with store.cond:
            while key not in store.items:
                if key in store.tombstones:
                    raise gone_error(key, self.name)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"payload {key!r} not available on connector {self.name!r} "
                        f"within {wait_s:g}s"
                    )
                store.cond.wait(remaining)
            _, packed = store.items.pop(key)
            store.tombstones.add(key)
        return unpack_payload(packed, where=f"connector {self.name!r} get {key!r}")

    def cleanup(self, request_id: str) -> int:
        return self._drop(lambda key, _owner: parse_payload_key(key)[0] == request_id)

    def cleanup_all(self) -> int:
        return self._drop(lambda _key, _owner: True)

    def num_pending(self) -> int:
        with self._store.cond:
            return len(self._store.items)

    def health(self) -> ConnectorHealth:
        detail = "closed" if self._closed else "in-process store"
        return ConnectorHealth(not self._closed, detail, self.num_pending())

    def close(self) -> None:
        """Drop the payloads this instance put and no one consumed; forget the store when unused."""
        if self._closed:
            return
        self._drop(lambda _key, owner: owner == self._id)
        self._closed = True
        with _STORES_LOCK:
            self._store.refs -= 1
            if self._store.refs == 0 and _STORES.get((self.namespace, self.name)) is self._store:
                del _STORES[(self.namespace, self.name)]

    def _drop(self, match: Any) -> int:
        store = self._store
        with store.cond:
            keys = [key for key, (owner, _) in store.items.items() if match(key, owner)]
            for key in keys:
                del store.items[key]
                store.tombstones.add(key)
        return len(keys)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"connector {self.name!r} is closed")
