"""What a recurrent layer (Mamba, gated delta-net) reads of its state: the step's
recurrent view (`RecurrentMetadata`, carried on the step's `AttentionMetadata.recurrent`,
read through `get_forward_context().recurrent`) and one layer's state tensors
(`RecurrentLayerState`: `[num_slots, *shape]`, and with speculative decoding a scratch
copy per speculative position, `[num_slots, max_spec_positions, *shape]`). The runner's
slot bookkeeping is `worker/recurrent.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RecurrentMetadata:
    """The recurrent-state view of one step: one entry per request scheduled this step, in
    flat token order."""

    state_slots: torch.Tensor
    """[R] int64 (model device): each request's state slot (held for the request's whole
    life in the runner; never a batch row)."""
    query_start_loc: list[int]
    """[R + 1]: flat offset of each request's first token this step (cumulative)."""
    query_lens: list[int]
    """[R]: tokens of each request this step."""
    has_initial_state: torch.Tensor
    """[R] bool (model device): False when the request starts at position 0 this step (its
    state starts from zeros); True for a later prefill chunk or a decode."""
    spec_lens: list[int]
    """[R]: 0 normally. q > 0 marks a speculative-verification row of q tokens: the layer
    computes them like any tokens (the main state ends after all q) and ALSO saves its state
    after each token j (j = 0..q-1) into `scratch[slot, j]`."""

    has_initial_state_cpu: list[bool] | None = None
    """Host copy of `has_initial_state` (set by `RecurrentSlots.metadata`), for layers that
    branch on it without reading the device tensor back."""

    @property
    def num_reqs(self) -> int:
        return len(self.query_lens)


@dataclass
class RecurrentLayerState:
    """One recurrent layer's state tensors."""

    tensors: tuple[torch.Tensor, ...]
    """Each [num_slots, *shape] (e.g. conv state, SSM state)."""
    scratch: tuple[torch.Tensor, ...] | None
    """Each [num_slots, max_spec_positions, *shape]; None without speculation."""
