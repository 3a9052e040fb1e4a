"""`SpecDecodeStats`: speculation totals of one engine (what the metrics export).

Acceptance rate = accepted / drafts; mean acceptance length (tokens per
verifying step) = 1 + accepted / verifying steps. Per draft position `j`, how
often the `j`-th draft was accepted (vLLM's `num_accepted_tokens_per_pos`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass
class SpecDecodeStats:
    num_speculative_tokens: int
    num_verifying_steps: int = 0
    """Request-steps that verified at least one draft."""
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.accepted_per_position:
            self.accepted_per_position = [0] * self.num_speculative_tokens

    def record(self, num_drafts: int, num_accepted: int) -> None:
        if num_drafts == 0:
            return
        self.num_verifying_steps += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        for j in range(num_accepted):
            self.accepted_per_position[j] += 1

    def copy(self) -> SpecDecodeStats:
        return dataclasses.replace(self, accepted_per_position=list(self.accepted_per_position))

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per verifying step (accepted drafts + the target's own token)."""
        if not self.num_verifying_steps:
            return 0.0
        return 1.0 + self.num_accepted_tokens / self.num_verifying_steps
