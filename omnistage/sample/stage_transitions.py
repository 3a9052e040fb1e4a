"""Stage transitions: "after trigger tokens T, force the token sequence S", applied on logits.

Example (think -> recaption -> draw): `</think>` -> `<recaption>`, and
`</recaption>` -> `<answer>`, `<boi>`. For each row the processor looks at
the row's real output history (never placeholders, DESIGN.md invariant 1):
if it ends with a trigger followed by the first k tokens of the forced
sequence (k < len(S)), every logit but S[k]'s becomes -inf. Once the history
diverges from S, or S is complete, nothing is forced.

Used as a logits processor configured on the engine (`stage_transitions=`),
or called by a model's own `sample()`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

TokenSeq = tuple[int, ...]


class StageTransitions:
    def __init__(self, rules: Mapping[Sequence[int], Sequence[int]]) -> None:
        self.rules: list[tuple[TokenSeq, TokenSeq]] = []
        for trigger, forced in rules.items():
            trigger, forced = tuple(trigger), tuple(forced)
            if not trigger or not forced:
                raise ValueError(
                    "stage_transitions: trigger and forced sequences must be non-empty"
                )
            self.rules.append((trigger, forced))
        self._window = max((len(t) + len(f) for t, f in self.rules), default=0)

    @classmethod
    def from_config(
        cls, config: Mapping[Any, Any], token_to_id: Callable[[str], int | None]
    ) -> StageTransitions:
        """Rules given as token strings or ids: {"</think>": ["<recaption>"], ...}.

        A key may be one token string, one id, or a tuple of them (a multi-token trigger).
        """

        def ids(value: Any, what: str) -> list[int]:
            items = value if isinstance(value, (list, tuple)) else [value]
            out = []
            for item in items:
                token_id = item if isinstance(item, int) else token_to_id(item)
                if token_id is None:
                    raise ValueError(
                        f"stage_transitions: {what} token {item!r} is not in the vocabulary"
                    )
                out.append(token_id)
            return out

        return cls({tuple(ids(k, "trigger")): ids(v, "forced") for k, v in config.items()})

    def forced_token(self, history: Sequence[int]) -> int | None:
        """The token the history must continue with, or None."""
        n = len(history)
        tail = list(history[max(0, n - self._window) :])
        m = len(tail)
        for trigger, forced in self.rules:
            for k in range(len(forced)):
                end = m - k  # where the trigger would end
                start = end - len(trigger)
                if start < 0:
                    break
                if tuple(tail[start:end]) == trigger and tuple(tail[end:]) == forced[:k]:
                    return forced[k]
        return None

    def apply(self, logits: torch.Tensor, histories: Sequence[Sequence[int]]) -> torch.Tensor:
        """Force rows in place: [B, V] logits, one real history per row."""
        for row, history in enumerate(histories):
            token = self.forced_token(history)
            if token is not None:
                keep = logits[row, token].clone()
                logits[row].fill_(float("-inf"))
                logits[row, token] = keep if torch.isfinite(keep) else 0.0
        return logits
