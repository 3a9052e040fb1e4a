"""`Request`: the engine core's view of one sequence being generated.

The scheduler reads and updates these. Token lists hold only real tokens:
`output_token_ids` grows only with confirmed sampled tokens. Tokens still in
flight (async scheduling) are counted in `num_output_placeholders` and never
stored in a list (DESIGN.md invariant 1).
"""

from __future__ import annotations

import enum
import hashlib
import time
from dataclasses import dataclass, field

import torch

from omnistage.core.multimodal_inputs import MultimodalDecoderInputs
from omnistage.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    """Where a request is in the engine core. There is no "waiting for input" here: a
    pipeline stage adds a request to its engine only once its input (a payload, or a
    stream's first chunk) has arrived; until then the stage's `InputCoordinator` holds it
    (WAITING_FOR_INPUT, with its timeout). A stream-fed request whose next conditioning
    rows have not come yet stays RUNNING with nothing to compute
    (`conditioned_positions_limit`)."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    # Everything after this point is finished.
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_ERROR = enum.auto()

    @property
    def finished(self) -> bool:
        return self > RequestStatus.PREEMPTED

    @property
    def finish_reason(self) -> str | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


@dataclass(eq=False)
class Request:
    """One sequence: prompt, confirmed outputs, progress and stopping rules."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None
    max_tokens: int
    """Resolved max output tokens (never past max_model_len)."""
    sample_seed: int
    """Seed of this sequence's sampling randomness (request seed, or one drawn per request)."""
    arrival_time: float = field(default_factory=time.monotonic)

    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_output_placeholders: int = 0
    """Tokens scheduled but not yet sampled (async scheduling). Accounting only."""
    num_cached_tokens: int = -1
    """Prompt tokens served from the prefix cache at first scheduling (-1: not yet)."""
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: int | str | None = None
    block_hashes: list[bytes] = field(default_factory=list)
    prompt_embeds: torch.Tensor | None = None
    """[num_prompt_tokens, hidden] embeddings used instead of the prompt's token embeddings
    (a stage conditioned on another stage's hidden states)."""
    mm_decoder_inputs: MultimodalDecoderInputs | None = None
    """3-D rotary positions (prompt, and generated tokens with `decode_positions`) and
    deepstack features of a multimodal prompt (images, GLM-Image's target grids)."""

    stream_conditioning: bool = False
    """The request takes one conditioning row per position after its prompt (added to that
    position's input embedding), streamed in from another stage while it generates."""
    conditioning: list[torch.Tensor] = field(default_factory=list)
    """Rows received so far, in pieces ([n, hidden] each)."""
    num_conditioning_sent: int = 0
    """Rows already shipped to the runner (all of them go again after a preemption)."""
    conditioning_finished: bool = False
    """No more rows will come: later positions get `conditioning_fill` (or nothing)."""
    conditioning_fill: torch.Tensor | None = None
    """[hidden]: the row every position past the last conditioning row gets, once finished."""

    num_proposed_drafts: int = 0
    """Speculation: drafts the runner holds for the request's next step (as last reported)."""
    num_draft_tokens: int = 0
    """Speculation: drafts verified for this request so far."""
    num_accepted_tokens: int = 0
    """Speculation: drafts accepted so far (acceptance rate = accepted / drafts)."""

    output_codes: list[list[int | float]] = field(default_factory=list)
    """Per confirmed output token, the extra codes its model sampled with it (models with
    `num_token_codes`, e.g. the residual codebooks of a speech-codec talker); else empty."""

    @property
    def num_conditioning_rows(self) -> int:
        return sum(rows.shape[0] for rows in self.conditioning)

    @property
    def conditioned_positions_limit(self) -> int | None:
        """Positions below this have their conditioning row; None when any position may run."""
        if not self.stream_conditioning or self.conditioning_finished:
            return None
        return self.num_prompt_tokens + self.num_conditioning_rows

    @property
    def cache_salt(self) -> bytes | None:
        """Mixed into the first block hash: prompts with embeddings only share equal embeddings,
        and prompts with 3-D positions / deepstack features (`mm_decoder_inputs`) only equal
        ones (a KV block depends on its rotary positions and on what deepstack added)."""
        if self.prompt_embeds is None and self.mm_decoder_inputs is None:
            return None
        if self._cache_salt is None:
            h = hashlib.blake2b(digest_size=16)
            if self.prompt_embeds is not None:
                t = self.prompt_embeds.detach().cpu().contiguous()
                h.update(t.view(torch.uint8).numpy())
            if self.mm_decoder_inputs is not None:
                h.update(b"mm" + self.mm_decoder_inputs.digest())
            self._cache_salt = h.digest()
        return self._cache_salt

    _cache_salt: bytes | None = field(default=None, init=False, repr=False)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Real tokens: prompt plus confirmed outputs."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
