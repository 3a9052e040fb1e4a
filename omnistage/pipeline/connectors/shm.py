"""The shared-memory connector: one POSIX shared-memory segment per payload (local default).

Segment names are deterministic, so any process of the pipeline can find the
segments of a request without a registry::

    omni_{namespace}_{h6(connector)}_{h16(request_id)}_{h8(edge)}_{chunk_index}

(``hN`` is the first N hex digits of a blake2b hash). ``cleanup(request_id)``
lists ``/dev/shm`` for the request's prefix and unlinks what it finds, from any
process; ``num_pending()`` counts the connector's segments there.

Lifetime: a segment belongs to its request, not to the process that made it.
``put`` creates the ``/dev/shm`` file itself (open with ``O_CREAT | O_EXCL``, size,
map, write), as ``shm_open`` does on Linux, never through Python's ``SharedMemory``
and its ``resource_tracker`` (3.11 has no ``track=False``; registering and
unregistering cost two messages to the tracker process per payload), so the
producer exiting does not unlink it and another process unlinking it causes no
"leaked shared_memory" warning. It is unlinked
by ``get`` (consume-once), by ``cleanup(request_id)``, by ``cleanup_all()``, or
by ``unlink_namespace(namespace)`` at pipeline shutdown. ``close()`` unlinks
nothing: the consumer may still need what this process produced.

``get`` and ``cleanup`` work on the ``/dev/shm`` files directly (open, unlink,
mmap), which is what ``shm_open``/``shm_unlink`` do on Linux, and keeps the
consumer away from the resource tracker altogether.

Copies: ``put`` writes the payload into the segment (the one copy); ``get`` maps
the claimed segment privately and hands out tensors that are views of the mapping
(the memory is freed when the last of them is), so a hand-off such as Bagel's KV
rows crosses processes with one copy.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import time
from collections.abc import Mapping
from typing import Any

from omnistage.core.payload import PackedPayload, Payload, unpack_payload
from omnistage.pipeline.connectors.base import (
    Connector,
    ConnectorHealth,
    PayloadHandle,
    Tombstones,
    gone_error,
    parse_payload_key,
)

SHM_DIR = "/dev/shm"


def _h(text: str, n: int) -> str:
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()[:n]


def _unlink_prefix(prefix: str) -> int:
    count = 0
    for entry in os.listdir(SHM_DIR):
        if entry.startswith(prefix):
            try:
                os.unlink(os.path.join(SHM_DIR, entry))
                count += 1
            except FileNotFoundError:  # a consumer or another cleanup got there first
                pass
    return count


def unlink_namespace(namespace: str) -> int:
    """Unlink every segment of a pipeline instance (all its shm connectors); for shutdown."""
    if not namespace.isalnum():
        raise ValueError(f"namespace must be letters or digits, got {namespace!r}")
    return _unlink_prefix(f"omni_{namespace}_")


def namespace_segments(namespace: str) -> list[str]:
    """Names of the segments in /dev/shm that belong to `namespace` (for tests and health)."""
    return sorted(e for e in os.listdir(SHM_DIR) if e.startswith(f"omni_{namespace}_"))


class SharedMemoryConnector(Connector):
    """Connector kind ``shm``; ``location`` is the segment name."""

    def __init__(self, name: str, options: Mapping[str, Any], *, namespace: str) -> None:
        super().__init__(name, options, namespace=namespace)
        if not os.path.isdir(SHM_DIR):
            raise RuntimeError(f"connector {name!r}: kind 'shm' needs {SHM_DIR} (Linux)")
        self._prefix = f"omni_{namespace}_{_h(name, 6)}_"
        self._tombstones = Tombstones()
        self._closed = False

    def segment_name(self, key: str) -> str:
        """The segment that holds `key` (deterministic, at most ~80 characters)."""
        request_id, edge, chunk = parse_payload_key(key)
        return f"{self._prefix}{_h(request_id, 16)}_{_h(edge, 8)}_{chunk}"

    def put(self, key: str, payload: Payload) -> PayloadHandle:
        self._check_open()
        name = self.segment_name(key)
        packed = PackedPayload(payload, where=f"connector {self.name!r} put {key!r}")
        path = os.path.join(SHM_DIR, name)
        try:  # what shm_open(O_CREAT | O_EXCL) does; no resource tracker involved
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        except FileExistsError:
            raise ValueError(
                f"payload {key!r} is already held by connector {self.name!r}"
            ) from None
        try:
            os.ftruncate(fd, packed.nbytes)
            with mmap.mmap(fd, packed.nbytes) as mapping:
                view = memoryview(mapping)
                try:
                    packed.write_into(view)
                finally:
                    view.release()
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        self._tombstones.discard(key)
        return PayloadHandle(self.name, key, name, packed.nbytes)

    def get(self, handle: PayloadHandle, timeout: float | None = None) -> Payload:
        """Claim the segment by unlinking it (exactly one consumer wins), then copy it out.

        A handle from ``put`` (``nbytes > 0``) whose segment is missing was consumed
        or cleaned up: ValueError at once. A handle with ``nbytes == 0`` names a
        payload that may not exist yet: wait for it up to the timeout.
        """
        self._check_open()
        self._check_handle(handle)
        key, path = handle.key, os.path.join(SHM_DIR, self.segment_name(handle.key))
        if handle.location != os.path.basename(path):
            raise ValueError(f"handle for {key!r} names segment {handle.location!r}, not {path!r}")
        wait_s = self._timeout(timeout)
        deadline, delay = time.monotonic() + wait_s, 0.001
        while True:
            fd = self._open_claimed(path, handle)
            if fd is not None:
                break
            if key in self._tombstones or handle.nbytes > 0:
                raise gone_error(key, self.name)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"payload {key!r} not available on connector {self.name!r} within {wait_s:g}s"
                )
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.05)
        self._tombstones.add(key)
        try:
            size = handle.nbytes or os.fstat(fd).st_size
            # A private (copy-on-write) mapping of the claimed, unlinked segment: the
            # payload's tensors are views of it and keep it alive, so reading copies
            # nothing; writing into a tensor copies only the page it touches.
            mm = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            return unpack_payload(mm, where=f"connector {self.name!r} get {key!r}", views=True)
        finally:
            os.close(fd)

    @staticmethod
    def _open_claimed(path: str, handle: PayloadHandle) -> int | None:
        """Open and unlink the segment; None if it is missing or (unannounced) still empty."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            size = os.fstat(fd).st_size
            if size == 0 or size < handle.nbytes:  # created, not yet sized by its producer
                os.close(fd)
                return None
            os.unlink(path)
        except FileNotFoundError:  # another consumer or a cleanup claimed it first
            os.close(fd)
            return None
        return fd

    def cleanup(self, request_id: str) -> int:
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"cleanup: request_id must be a non-empty str, got {request_id!r}")
        return _unlink_prefix(f"{self._prefix}{_h(request_id, 16)}_")

    def cleanup_all(self) -> int:
        return _unlink_prefix(self._prefix)

    def num_pending(self) -> int:
        return sum(1 for entry in os.listdir(SHM_DIR) if entry.startswith(self._prefix))

    def health(self) -> ConnectorHealth:
        ok = not self._closed and os.access(SHM_DIR, os.W_OK)
        detail = "closed" if self._closed else f"{SHM_DIR}/{self._prefix}*"
        return ConnectorHealth(ok, detail, self.num_pending())

    def close(self) -> None:
        """Mark the instance closed; segments stay until consumed or cleaned up (module doc)."""
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"connector {self.name!r} is closed")
