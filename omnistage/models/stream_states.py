"""`StreamStates`: what a generation model's streams keep between their chunks, as one
`generate` call sees it (`GenerationItem.state`: one dict per stream, owned by the stage)."""

from __future__ import annotations

from typing import Any

from omnistage.models.generation import GenerationItem


class StreamStates:
    """The value each stream keeps under `key` of its state: a stream's chunks earlier in
    the same call come first (two chunks of a stream in one call decode in order), and
    nothing is written to the states until `commit`, called when the whole call went well
    (the stage retries a failed batch item by item: no stream may have advanced)."""

    def __init__(self, key: str) -> None:
        self.key = key
        self._advanced: dict[int, tuple[dict[str, Any], Any]] = {}

    def kept(self, item: GenerationItem) -> Any:
        """What the item's stream holds before this item (None: nothing yet, or no stream)."""
        state = item.state
        if state is None:
            return None
        if id(state) in self._advanced:
            return self._advanced[id(state)][1]
        return state.get(self.key)

    def advance(self, item: GenerationItem, value: Any) -> None:
        """The item's stream after it (kept until `commit`)."""
        if item.state is None:
            raise ValueError("advance: the item is not a stream's chunk")
        self._advanced[id(item.state)] = (item.state, value)

    def commit(self) -> None:
        for state, value in self._advanced.values():
            state[self.key] = value
