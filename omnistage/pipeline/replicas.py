"""`ReplicaBalancer`: which replica of a replicated stage serves each request.

A stage with `ray.replicas: N` runs as N instances (`talker#0`, `talker#1`, ...). A
request is given to one of them when it reaches the stage (its `SubmitRequest`): the
live replica with the fewest requests assigned, the lowest index on a tie. The
choice is remembered, and everything else for that request (payload handles,
aborts) goes to the same replica, until the request ends (`forget`). A replica that
goes down gives up its requests (`down`: they fail, naming it) and gets no new ones
until it is up again (`up`). The orchestrator's thread calls every method here.
"""

from __future__ import annotations


class ReplicaBalancer:
    def __init__(self, replicas: dict[str, tuple[str, ...]]) -> None:
        self._replicas = {stage: names for stage, names in replicas.items() if len(names) > 1}
        """Replicated stage -> its instance names."""
        self._live = {name for names in self._replicas.values() for name in names}
        self._assigned: dict[tuple[str, str], str] = {}
        """(stage, request id) -> the instance serving it."""
        self._load = dict.fromkeys(self._live, 0)
        """Instance -> requests assigned to it."""

    def replicated(self, stage: str) -> bool:
        return stage in self._replicas

    def instances(self, stage: str) -> tuple[str, ...]:
        return self._replicas.get(stage, ())

    def assign(self, stage: str, request_id: str) -> str | None:
        """The instance serving `request_id` on `stage`, chosen now if it has none; None
        when every replica is down."""
        key = (stage, request_id)
        if key in self._assigned:
            return self._assigned[key]
        live = [name for name in self._replicas[stage] if name in self._live]
        if not live:
            return None
        chosen = min(live, key=lambda name: self._load[name])  # min keeps the first of a tie
        self._assigned[key] = chosen
        self._load[chosen] += 1
        return chosen

    def assigned(self, stage: str, request_id: str) -> str | None:
        """The instance serving `request_id` on `stage`, or None if none was chosen."""
        return self._assigned.get((stage, request_id))

    def forget(self, request_id: str) -> None:
        """`request_id` ended: its replicas are free of it."""
        for stage in self._replicas:
            name = self._assigned.pop((stage, request_id), None)
            if name is not None:
                self._load[name] -= 1

    def down(self, instance: str) -> list[str]:
        """`instance` died: it gets no new request; the ids of those it served (they are
        no longer assigned to it)."""
        self._live.discard(instance)
        lost = [rid for (_, rid), name in self._assigned.items() if name == instance]
        for key in [k for k, name in self._assigned.items() if name == instance]:
            del self._assigned[key]
        self._load[instance] = 0
        return lost

    def up(self, instance: str) -> None:
        if instance in self._load:
            self._live.add(instance)

    def any_live(self, stage: str) -> bool:
        return any(name in self._live for name in self._replicas.get(stage, ()))

    def num_assigned(self) -> int:
        """Requests assigned to some replica (zero when nothing runs: a leak check)."""
        return len(self._assigned)
