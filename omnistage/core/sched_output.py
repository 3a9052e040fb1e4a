"""Messages between scheduler and model runner.

`SchedulerOutput` carries only what changed (STYLE.md 6): requests new to the
runner in full, requests it already knows as deltas, and the ids that ended.
`ModelRunnerOutput` carries back what one step produced. Both are msgspec
structs so that an executor in another process can ship them as they are.
"""

from __future__ import annotations

import msgspec

from omnistage.core.multimodal_inputs import MultimodalDecoderData
from omnistage.core.tensor_blob import TensorBlob
from omnistage.sampling_params import SamplingParams


class NewRequestData(msgspec.Struct, kw_only=True):
    """A request the runner has not seen (or lost on preemption): everything it needs."""

    req_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    """Real outputs so far (non-empty only when resuming after preemption)."""
    sampling_params: SamplingParams
    sample_seed: int
    block_ids: list[int]
    num_computed_tokens: int
    prompt_embeds: TensorBlob | None = None
    """Embeddings replacing the prompt's token embeddings, when the request has them."""
    mm_decoder_inputs: MultimodalDecoderData | None = None
    """3-D rotary positions (prompt and generated tokens) and deepstack features of a
    multimodal prompt, when it has them (sent whole again after a preemption)."""
    stream_conditioning: bool = False
    conditioning: TensorBlob | None = None
    """Every conditioning row received so far (stream-conditioned requests)."""
    conditioning_fill: TensorBlob | None = None
    """The row of every position past the last one, once the rows have finished."""
    output_codes: list[list[int | float]] = msgspec.field(default_factory=list)
    """The extra codes of each output so far (models with `num_token_codes`)."""


class CachedRequestData(msgspec.Struct, kw_only=True):
    """Requests the runner knows, as parallel lists (cheap to ship): new blocks and progress."""

    req_ids: list[str] = msgspec.field(default_factory=list)
    new_block_ids: list[list[int]] = msgspec.field(default_factory=list)
    num_computed_tokens: list[int] = msgspec.field(default_factory=list)

    def add(self, req_id: str, new_block_ids: list[int], num_computed_tokens: int) -> None:
        self.req_ids.append(req_id)
        self.new_block_ids.append(new_block_ids)
        self.num_computed_tokens.append(num_computed_tokens)


class SchedulerOutput(msgspec.Struct, kw_only=True):
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    """Tokens to compute this step, per request."""
    total_num_scheduled_tokens: int
    finished_req_ids: set[str]
    """Requests that ended since the last step: the runner drops their state."""
    preempted_req_ids: set[str]
    """Requests preempted this step: the runner drops their state; they come back as new."""
    new_conditioning: dict[str, TensorBlob] = msgspec.field(default_factory=dict)
    """Conditioning rows that arrived since a known request was last scheduled."""
    new_conditioning_fill: dict[str, TensorBlob] = msgspec.field(default_factory=dict)
    """The fill rows of known requests whose conditioning finished since last scheduled."""
    scheduled_spec_tokens: dict[str, int] = msgspec.field(default_factory=dict)
    """Speculation: how many of a request's scheduled tokens are draft slots (requests with
    none are absent). The runner fills up to that many with the drafts it holds."""

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0


class ModelRunnerOutput(msgspec.Struct, kw_only=True):
    req_ids: list[str]
    """Requests of this step, in batch order."""
    sampled_token_ids: list[list[int]]
    """Per request: the tokens sampled this step (empty while a prompt is still being chunked)."""
    logprobs: list[list[tuple[list[int], list[float], int]] | None]
    """Per request, per sampled token: (top token ids, their logprobs, rank of the sampled
    token). The sampled token is first in the lists. None when not asked for."""
    hidden_states: TensorBlob | None = None
    """With `output_hidden_states`: the final hidden state of every position this step
    computed for good (a rejected draft's position is not), requests in `req_ids` order."""
    hidden_starts: list[int] | None = None
    """Per request: the position of its first hidden-state row this step."""
    hidden_counts: list[int] | None = None
    """Per request: its hidden-state rows this step."""
    verified_drafts: list[int] | None = None
    """Speculation: per request, the drafts verified this step (accepted ones are the
    sampled tokens but the last)."""
    proposed_drafts: list[int] | None = None
    """Speculation: per request, how many drafts the runner holds for its next step."""
    sampled_codes: list[list[int | float]] | None = None
    """Models with `num_token_codes`: per request, the codes sampled with this step's token
    (empty when it sampled none)."""

    @property
    def req_id_to_index(self) -> dict[str, int]:
        return {r: i for i, r in enumerate(self.req_ids)}
