"""Per-request recurrent state (conv + SSM state of Mamba / gated delta-net layers).

Recurrent layers keep no KV cache: each request owns one *state slot* for its
whole life in the runner, and every recurrent layer keeps, per slot, a fixed
set of state tensors (e.g. the causal conv's last inputs and the SSM state).

- `RecurrentSlots` is the runner's slot bookkeeping (keyed by request id,
  never by batch row: rows move when the batch is condensed, DESIGN.md
  invariant 4). A slot is taken when the runner adds a request and given back
  when it leaves (finished, aborted or preempted: invariant 8).
- `RecurrentMetadata` and `RecurrentLayerState` (what layers read: the step's
  recurrent view and one layer's state tensors) live in `layers/recurrent_state.py`.
- `commit_accepted` copies, after verification, the scratch state of each
  request's last accepted position into its main state.

A request whose step starts at position 0 (`has_initial_state` False) starts
from zeros, whatever its slot held before: slots are never cleared on reuse.
"""

from __future__ import annotations

import torch

from omnistage.layers.recurrent_state import RecurrentLayerState, RecurrentMetadata


def allocate_recurrent_state(
    shapes: list[tuple[tuple[int, ...], ...]],
    num_slots: int,
    dtype: torch.dtype,
    device: torch.device | str,
    spec_positions: int = 0,
) -> list[RecurrentLayerState]:
    """Zeroed state for every recurrent layer: `shapes[i]` holds the per-slot shape of each
    state tensor of layer i. `spec_positions > 0` also allocates that many scratch states
    per slot (speculative verification)."""
    if num_slots <= 0:
        raise ValueError(f"num_slots: must be positive, got {num_slots}")
    if spec_positions < 0:
        raise ValueError(f"spec_positions: must be >= 0, got {spec_positions}")
    states = []
    for layer_shapes in shapes:
        tensors = tuple(
            torch.zeros((num_slots, *shape), dtype=dtype, device=device) for shape in layer_shapes
        )
        scratch = None
        if spec_positions > 0:
            scratch = tuple(
                torch.zeros((num_slots, spec_positions, *shape), dtype=dtype, device=device)
                for shape in layer_shapes
            )
        states.append(RecurrentLayerState(tensors=tensors, scratch=scratch))
    return states


def commit_accepted(
    states: list[RecurrentLayerState], slots: torch.Tensor, accepted: torch.Tensor
) -> None:
    """For every layer and tensor: `tensor[slots] = scratch[slots, accepted]`.

    `slots` [n] int64 and `accepted` [n] int64 are device tensors (no host sync):
    `accepted[i]` is the index, within request i's verification row, of its last accepted
    position."""
    for layer in states:
        if layer.scratch is None:
            raise ValueError("commit_accepted: the recurrent state has no scratch (no speculation)")
        for tensor, scratch in zip(layer.tensors, layer.scratch, strict=True):
            tensor.index_copy_(0, slots, scratch[slots, accepted])


class RecurrentSlots:
    """The runner's slot bookkeeping: one state slot per request it holds.

    `add(req_id)` when the runner adds a request, `remove(req_id)` when it drops it
    (finished, aborted, preempted). The lowest free slot is handed out first."""

    def __init__(self, num_slots: int) -> None:
        if num_slots <= 0:
            raise ValueError(f"num_slots: must be positive, got {num_slots}")
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))  # a stack: pop() gives the lowest
        self._slot_of: dict[str, int] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._slot_of)

    def add(self, req_id: str) -> int:
        """Take a slot for `req_id` (which must not hold one)."""
        if req_id in self._slot_of:
            raise RuntimeError(
                f"request {req_id!r} already holds state slot {self._slot_of[req_id]}"
            )
        if not self._free:
            raise RuntimeError(f"no free recurrent state slot (all {self.num_slots} are held)")
        slot = self._free.pop()
        self._slot_of[req_id] = slot
        return slot

    def remove(self, req_id: str) -> None:
        """Give back `req_id`'s slot; a request that holds none is ignored (it may have
        finished before the runner ever saw it)."""
        slot = self._slot_of.pop(req_id, None)
        if slot is not None:
            self._free.append(slot)
            self._free.sort(reverse=True)

    def slot_of(self, req_id: str) -> int:
        return self._slot_of[req_id]

    def metadata(
        self,
        req_ids: list[str],
        query_lens: list[int],
        starts: list[int],
        spec_lens: list[int],
        device: torch.device | str,
    ) -> RecurrentMetadata:
        """The step's `RecurrentMetadata` for the scheduled requests in flat order (`starts`:
        the position each request starts at this step)."""
        if not (len(req_ids) == len(query_lens) == len(starts) == len(spec_lens)):
            raise ValueError("metadata: req_ids, query_lens, starts and spec_lens differ in length")
        loc = [0]
        for n in query_lens:
            loc.append(loc[-1] + int(n))
        has_init = [int(s) > 0 for s in starts]
        return RecurrentMetadata(
            state_slots=torch.tensor(
                [self._slot_of[r] for r in req_ids], dtype=torch.int64, device=device
            ),
            query_start_loc=loc,
            query_lens=[int(n) for n in query_lens],
            has_initial_state=torch.tensor(has_init, dtype=torch.bool, device=device),
            spec_lens=[int(q) for q in spec_lens],
            has_initial_state_cpu=has_init,
        )
