"""`StreamStates`: a stream's chunks earlier in one `generate` call come first, nothing
reaches the streams' state dicts before `commit`, and an item that is not a stream's
chunk has nothing kept and cannot advance."""

from __future__ import annotations

import pytest
import torch

from omnistage.models.generation import GenerationItem
from omnistage.models.stream_states import StreamStates


def test_pending_values_come_first_and_commit_writes_them():
    state: dict = {"k": "before"}
    first, second = (GenerationItem(torch.zeros(1, 2), state=state) for _ in range(2))
    other = GenerationItem(torch.zeros(1, 2), state={})
    streams = StreamStates("k")
    assert streams.kept(first) == "before" and streams.kept(other) is None
    streams.advance(first, "after first")
    assert streams.kept(second) == "after first"  # the same stream, later in the call
    assert state["k"] == "before"  # nothing written yet: a failed call leaves it
    streams.advance(second, "after second")
    streams.commit()
    assert state["k"] == "after second" and "k" not in other.state


def test_an_item_without_a_stream_keeps_nothing():
    whole = GenerationItem(torch.zeros(1, 2))
    streams = StreamStates("k")
    assert streams.kept(whole) is None
    with pytest.raises(ValueError, match="not a stream's chunk"):
        streams.advance(whole, 1)
