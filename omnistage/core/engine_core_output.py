"""`EngineCoreOutput`: what one step of the engine core reports for one request."""

from __future__ import annotations

from typing import Any

import msgspec


class EngineCoreOutput(msgspec.Struct, kw_only=True):
    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[tuple[list[int], list[float], int]] | None = None
    """Per new token: (top token ids, logprobs, rank of the sampled token); sampled first."""
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    hidden_states: Any = None
    """With `output_hidden_states`: [n, hidden] tensor of the positions computed this step,
    starting at `hidden_start`. Only steps the scheduler accepted ever report these."""
    hidden_start: int = 0
    new_codes: list[list[int | float]] | None = None
    """Models with `num_token_codes`: the extra codes of each new token."""
    num_draft_tokens: int = 0
    """Speculation: drafts verified for the request so far (a running total)."""
    num_accepted_tokens: int = 0
    """Speculation: drafts accepted for the request so far (a running total)."""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
