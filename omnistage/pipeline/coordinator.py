"""Consumer side of an edge: requests that wait for their input (WAITING_FOR_INPUT).

A request submitted to a consumer stage with `wait_for` edges is parked here
until a payload (or, for stream edges, each next chunk) has arrived. This is the
one place a request waits for input: the stage adds it to its engine only when
its input (a payload, or a stream's first chunk) is here, so a parked request
holds no engine request, KV blocks or batch row. A stream-fed request stays here
while it runs, until the stream's last chunk (its engine request meanwhile
computes only the positions whose conditioning rows have come).

Each wait has a deadline (`input_timeout_s` of the consumer stage), restarted
by every arrival: a request whose input does not come in time fails with "no
input from stage X on edge X->Y within N s" (DESIGN.md invariant 7). Entries leave when the
request has all its input, is aborted, or fails — `num_entries` returns to zero
(invariant 8).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class WaitingRequest:
    request_id: str
    submit: Any
    """The `SubmitRequest` that parked it (kept to start the request later)."""
    waiting_edges: set[str]
    """Edges ("producer->consumer") that still owe a payload or their last chunk."""
    deadline: float
    received: dict[str, Any] = field(default_factory=dict)


class InputCoordinator:
    def __init__(self, timeout_s: float, clock: Any = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self.clock = clock
        self.entries: dict[str, WaitingRequest] = {}

    def park(self, request_id: str, submit: Any, edges: list[str]) -> None:
        if request_id in self.entries:
            raise ValueError(f"request_id: {request_id!r} is already waiting for input")
        self.entries[request_id] = WaitingRequest(
            request_id, submit, set(edges), self.clock() + self.timeout_s
        )

    def is_waiting(self, request_id: str) -> bool:
        return request_id in self.entries

    def arrived(self, request_id: str, edge: str, value: Any, last: bool) -> WaitingRequest | None:
        """Record input on `edge`; restarts the wait. Returns the entry (None if unknown)."""
        entry = self.entries.get(request_id)
        if entry is None:
            return None
        entry.received[edge] = value
        entry.deadline = self.clock() + self.timeout_s
        if last:
            entry.waiting_edges.discard(edge)
        return entry

    def release(self, request_id: str) -> WaitingRequest | None:
        """The request has all it waited for (or ended): forget it."""
        return self.entries.pop(request_id, None)

    def expired(self) -> list[tuple[str, str]]:
        """(request id, an edge it still waits on) for every wait past its deadline; released."""
        now = self.clock()
        late = [e for e in self.entries.values() if e.deadline <= now]
        for entry in late:
            del self.entries[entry.request_id]
        return [(e.request_id, sorted(e.waiting_edges)[0]) for e in late]

    def next_deadline(self) -> float | None:
        return min((e.deadline for e in self.entries.values()), default=None)

    @property
    def num_entries(self) -> int:
        return len(self.entries)


def timeout_message(edge: str, timeout_s: float) -> str:
    producer = edge.split("->", 1)[0]
    return f"no input from stage {producer} on edge {edge} within {timeout_s:g} s"
