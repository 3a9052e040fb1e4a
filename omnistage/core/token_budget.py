"""`TokenBudget`: one step's token budget, and what the scheduler gave to whom."""

from __future__ import annotations


class TokenBudget:
    """Tokens left this step and what was scheduled, in schedule order."""

    def __init__(self, total: int) -> None:
        self.left = total
        self.used = 0
        self.scheduled: dict[str, int] = {}
        self.spec: dict[str, int] = {}
        """Draft slots among the scheduled tokens, for requests that have any."""

    def take(self, req_id: str, n: int, num_spec: int = 0) -> None:
        self.scheduled[req_id] = n
        self.left -= n
        self.used += n
        if num_spec:
            self.spec[req_id] = num_spec
