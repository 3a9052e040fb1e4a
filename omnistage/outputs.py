"""What `LLM.generate` returns: `RequestOutput` with one `CompletionOutput` per sample."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Logprob:
    """Log-probability of one token at one position, its rank and its text."""

    logprob: float
    rank: int
    decoded_token: str | None = None


# Per generated token: token id -> Logprob (the top-N and the sampled token).
SampleLogprobs = list[dict[int, Logprob]]


@dataclass
class CompletionOutput:
    """One sample of a request."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    """"stop" (EOS, stop token or stop string), "length" (max_tokens or context), "abort"."""
    stop_reason: int | str | None = None
    """The stop token id or stop string that ended it, if any."""
    logprobs: SampleLogprobs | None = None
    cumulative_logprob: float | None = None
    num_draft_tokens: int = 0
    """Speculative decoding: drafts verified for this sample."""
    num_accepted_tokens: int = 0
    """Speculative decoding: drafts accepted (acceptance rate: accepted / drafts)."""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """The state of one request: its prompt and its samples so far."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    num_cached_tokens: int = 0
    """Prompt tokens served from the prefix cache."""
