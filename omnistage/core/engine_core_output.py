"""`EngineCoreOutput`: what one step of the engine core reports for one request."""

from __future__ import annotations

import msgspec


class EngineCoreOutput(msgspec.Struct, kw_only=True):
    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[tuple[list[int], list[float], int]] | None = None
    """Per new token: (top token ids, logprobs, rank of the sampled token); sampled first."""
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
