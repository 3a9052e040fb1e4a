"""`NgramProposer`: draft tokens by prompt lookup (no model).

The last `n` tokens of a request's history (prompt and outputs) are looked up
earlier in that history, longest `n` first (`prompt_lookup_max` down to
`prompt_lookup_min`); the tokens that followed the most recent earlier match
are the draft. Cheap, and strong where outputs copy their input (editing code,
summarising a given document, repeating a list).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from omnistage.spec_decode.proposer import DraftHost


class NgramProposer:
    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int) -> None:
        self.min_n = prompt_lookup_min
        self.max_n = prompt_lookup_max

    def propose(
        self, runner: DraftHost, inputs: Any, wanted: dict[int, int], hidden: Any = None
    ) -> dict[int, list[int]]:
        """Drafts of each batch row in `wanted` (row -> most drafts), from its history."""
        batch = runner.batch
        return {
            row: self.lookup(batch.token_ids[row, : batch.num_tokens[row]], k)
            for row, k in wanted.items()
        }

    def lookup(self, history: np.ndarray, k: int) -> list[int]:
        """Up to `k` tokens that followed the latest earlier occurrence of the longest
        matching suffix of `history` (1-D token ids); [] when nothing matches."""
        length = len(history)
        if k <= 0:
            return []
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            suffix = history[length - n :]
            # Windows starting at 0 .. length - n - 1: each is followed by at least one token.
            windows = sliding_window_view(history[: length - 1], n)
            hits = np.flatnonzero((windows == suffix).all(axis=1))
            if len(hits):
                start = int(hits[-1]) + n
                return history[start : start + k].tolist()
        return []
