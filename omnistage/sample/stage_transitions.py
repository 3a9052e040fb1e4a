"""Stage transitions: "after trigger tokens T, force the token sequence S", applied on logits.

Example (think -> recaption -> draw): `</think>` -> `<recaption>`, and
`</recaption>` -> `<answer>`, `<boi>`. For each row the processor looks at
the row's real output history (never placeholders, DESIGN.md invariant 1):
if it ends with a trigger followed by the first k tokens of the forced
sequence (k < len(S)), every logit but S[k]'s becomes -inf. Once the history
diverges from S, or S is complete, nothing is forced.

Section budgets bound how long a section may run: `{"</think>": {"max_tokens":
24}, "</recaption>": {"after": "<recaption>", "max_tokens": 32}}` forces
`</think>` once 24 tokens were generated without one, and `</recaption>` once
32 tokens followed the `<recaption>` that opened the caption without one (a
thinking budget; it also lets a random-weight demo thinker always finish its
sections). A prompt that ends with the opening token (a chat template that opens the
answer with `<think>`) opens the section at the output's start.

Used as a logits processor configured on the engine (`stage_transitions=`,
`stage_budgets=`), or called by a model's own `sample()`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

TokenSeq = tuple[int, ...]


@dataclass(frozen=True)
class SectionBudget:
    """Force `close` once `max_tokens` tokens followed the opening `after` of the open
    section (the first `after` since the last `close`) without a `close`; with `after`
    None, once the output's first `max_tokens` tokens went by without one."""

    close: int
    max_tokens: int
    after: int | None = None

    def forced_token(self, history: Sequence[int], prompt_last: int | None = None) -> int | None:
        """`prompt_last`: the prompt's last token (an `after` there opens the section)."""
        if self.after is None:  # the section opens with the output and closes once
            if len(history) < self.max_tokens or self.close in history:
                return None
            return self.close
        # The open section starts at the first `after` since the last `close` (a repeated
        # `after` inside it does not restart the budget).
        closed = max((i for i, t in enumerate(history) if t == self.close), default=-1)
        if closed < 0 and prompt_last == self.after:
            start: int | None = -1  # opened by the prompt
        else:
            after = range(closed + 1, len(history))
            start = next((i for i in after if history[i] == self.after), None)
        if start is None or len(history) - (start + 1) < self.max_tokens:
            return None
        return self.close


class StageTransitions:
    def __init__(
        self,
        rules: Mapping[Sequence[int], Sequence[int]],
        budgets: Sequence[SectionBudget] = (),
    ) -> None:
        self.budgets = tuple(budgets)
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
        cls,
        config: Mapping[Any, Any],
        token_to_id: Callable[[str], int | None],
        budgets: Mapping[Any, Any] | None = None,
    ) -> StageTransitions:
        """Rules given as token strings or ids: {"</think>": ["<recaption>"], ...}.

        A key may be one token string, one id, or a tuple of them (a multi-token trigger).
        `budgets`: {close token: {"max_tokens": N, "after": open token (optional)}}.
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

        def budget(close: Any, spec: Any) -> SectionBudget:
            where = f"stage_budgets[{close!r}]"
            if not isinstance(spec, Mapping) or set(spec) - {"max_tokens", "after"}:
                raise ValueError(f"{where}: expected {{max_tokens: N, after: token (optional)}}")
            limit = spec.get("max_tokens")
            if type(limit) is not int or limit < 0:
                raise ValueError(f"{where}.max_tokens: expected an integer >= 0, got {limit!r}")
            if isinstance(close, (list, tuple)):
                raise ValueError(f"{where}: the close token must be one token")
            (close_id,) = ids(close, "budget close")
            after = spec.get("after")
            after_id = None if after is None else ids(after, "budget after")[0]
            return SectionBudget(close_id, limit, after_id)

        return cls(
            {tuple(ids(k, "trigger")): ids(v, "forced") for k, v in config.items()},
            [budget(k, v) for k, v in (budgets or {}).items()],
        )

    def forced_token(self, history: Sequence[int], prompt_last: int | None = None) -> int | None:
        """The token the history must continue with, or None (`prompt_last`: the prompt's
        last token, for budgets of a section the prompt opens)."""
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
        for budget in self.budgets:
            token = budget.forced_token(history, prompt_last)
            if token is not None:
                return token
        return None

    def apply(
        self,
        logits: torch.Tensor,
        histories: Sequence[Sequence[int]],
        prompts: Sequence[Sequence[int]] | None = None,
    ) -> torch.Tensor:
        """Force rows in place: [B, V] logits, one real output history (and prompt) per row."""
        for row, history in enumerate(histories):
            prompt = prompts[row] if prompts is not None else ()
            token = self.forced_token(history, prompt[-1] if len(prompt) else None)
            if token is not None:
                keep = logits[row, token].clone()
                logits[row].fill_(float("-inf"))
                logits[row, token] = keep if torch.isfinite(keep) else 0.0
        return logits
