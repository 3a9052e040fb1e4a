"""The proposer interface, and what a proposer may read of the runner that drives it.

spec_decode sits below worker: the model runner imports the proposers' interface
and the verification rule from here, and nothing here imports worker. A proposer
sees the runner only through `DraftHost` (which `worker.model_runner.ModelRunner`
provides) and runs its model passes in the forward context its `PassLayout`
enters, so the direction of the dependency is checked by imports alone.

After every step that sampled, the runner calls `propose(host, inputs, wanted,
hidden)`; a proposer returns, for the rows in `wanted`, at most `wanted[row]`
draft tokens, which the runner keeps in the request's own state (never by row)
and the next step verifies (verify.py).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol

import numpy as np
import torch


class PassLayout(Protocol):
    """Where each token of one forward pass sits (worker/flat_layout.py: `FlatLayout`)."""

    tok_rows: np.ndarray
    """[T] the batch row of each token."""
    positions: np.ndarray
    """[T] the position of each token in its request."""
    ends: np.ndarray
    """[R] flat index one past each row's last token."""

    def forward_context(self) -> AbstractContextManager[None]:
        """Enter the pass's forward context: a model called inside attends as laid out."""
        ...


class DraftHost(Protocol):
    """What a proposer reads of the model runner."""

    batch: Any
    """The persistent batch: `token_ids[row]` (history, then this step's drafts),
    `num_tokens[row]`, `states[row]` (`RequestState`: `num_computed_tokens`, and
    `draft_num_computed`, which a drafter with a KV cache advances)."""

    def flat_layout(self, rows: np.ndarray, start: np.ndarray, n: np.ndarray) -> PassLayout:
        """The layout of a pass over `n[i]` tokens of row `rows[i]` from `start[i]`, over
        the runner's block tables (a drafter's cache shares them)."""
        ...

    def drafts_allowed(self, req_id: str) -> bool:
        """False for a request whose inputs are more than token ids (prompt embeddings,
        3-D positions): it gets no drafts, and a drafter does not follow it."""
        ...


class Proposer(Protocol):
    def propose(
        self, runner: DraftHost, inputs: Any, wanted: dict[int, int], hidden: torch.Tensor
    ) -> dict[int, list[int]]:
        """Drafts for the rows in `wanted` (at most `wanted[row]` each). `inputs`: the
        step's `StepInputs` (`rows`, `row_counts`, `positions`); `hidden`: its final
        hidden states, one row per flat token."""
        ...
