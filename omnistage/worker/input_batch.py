"""`InputBatch`: the runner's persistent, row-indexed state of the requests it runs.

Each request the runner knows occupies one row: its known token ids, block
table and sampling settings. Rows are filled from the front; when requests
leave, `condense()` moves the last rows into the holes. `_move_row` is the one
place that moves a row, and it moves *all* of the row's state at once
(DESIGN.md invariant 4) — nothing indexed by row may live anywhere else.

The request's real output history lives in its `RequestState` (the one true
history, invariant 1); the row only points at it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from omnistage.core.multimodal_inputs import MultimodalDecoderInputs
from omnistage.sample.metadata import RowSamplingState
from omnistage.sampling_params import SamplingParams


@dataclass(eq=False)
class RequestState:
    """What the runner knows of one request."""

    req_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    """Real sampled tokens only — the history every sampler and processor reads."""
    sampling_params: SamplingParams
    sample_seed: int
    block_ids: list[int]
    num_computed_tokens: int
    eos_token_id: int | None = None
    prompt_embeds: torch.Tensor | None = None
    """Embeddings used instead of the prompt's token embeddings (conditioned stages)."""
    mm_decoder_inputs: MultimodalDecoderInputs | None = None
    """3-D rotary positions (of the prompt and, with `decode_positions`, of the generated
    tokens) and deepstack features of a multimodal prompt (positions and mask on the CPU,
    features on the model's device)."""
    conditioning: torch.Tensor | None = None
    """Stream-conditioned requests: rows added to the input embeddings of the positions
    after the prompt, one per position (positions past the last row get none)."""
    conditioning_fill: torch.Tensor | None = None
    """Once the conditioning rows have finished: the row of every position after them."""
    output_codes: list[list[int | float]] = field(default_factory=list)
    """Models with `num_token_codes`: the codes (float rows where `token_codes_are_floats`)
    sampled with each output token, fed back with that token (`CausalLM.feed_back_codes`)."""
    draft_token_ids: list[int] = field(default_factory=list)
    """Speculation: the drafts proposed for this request's next step (not history)."""
    draft_num_computed: int = 0
    """Speculation with a draft model or MTP: positions whose keys the draft model (the MTP
    layer) holds."""

    sampling_row: RowSamplingState = field(init=False)
    """What sampling reads of this request; it holds the same history list, so it is
    current at every step without being rebuilt."""

    def __post_init__(self) -> None:
        self.sampling_row = RowSamplingState(
            sampling_params=self.sampling_params,
            seed=self.sample_seed,
            prompt_token_ids=self.prompt_token_ids,
            output_token_ids=self.output_token_ids,
            eos_token_id=self.eos_token_id,
            req_id=self.req_id,
            output_codes=self.output_codes,
        )

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)


class InputBatch:
    def __init__(self, max_num_reqs: int, max_model_len: int, max_blocks_per_req: int) -> None:
        self.max_num_reqs = max_num_reqs
        self.token_ids = np.zeros((max_num_reqs, max_model_len), dtype=np.int64)
        self.num_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        self.block_table = np.zeros((max_num_reqs, max_blocks_per_req), dtype=np.int64)
        self.num_blocks = np.zeros(max_num_reqs, dtype=np.int64)
        self.states: list[RequestState | None] = [None] * max_num_reqs
        self.req_id_to_row: dict[str, int] = {}
        self._holes: list[int] = []
        self.num_rows = 0

    def __len__(self) -> int:
        return len(self.req_id_to_row)

    def add(self, state: RequestState) -> int:
        if self._holes:
            row = min(self._holes)
            self._holes.remove(row)
        else:
            if self.num_rows >= self.max_num_reqs:
                raise RuntimeError("input batch is full")
            row = self.num_rows
            self.num_rows += 1
        tokens = state.prompt_token_ids + state.output_token_ids
        self.token_ids[row, : len(tokens)] = tokens
        self.num_tokens[row] = len(tokens)
        self.num_blocks[row] = 0
        self.append_blocks(row, state.block_ids)
        self.states[row] = state
        self.req_id_to_row[state.req_id] = row
        return row

    def remove(self, req_id: str) -> None:
        row = self.req_id_to_row.pop(req_id, None)
        if row is None:
            return
        self.states[row] = None
        self._holes.append(row)

    def append_blocks(self, row: int, block_ids: list[int]) -> None:
        start = int(self.num_blocks[row])
        self.block_table[row, start : start + len(block_ids)] = block_ids
        self.num_blocks[row] = start + len(block_ids)

    def append_tokens(self, rows: list[int], token_ids: list[int]) -> None:
        """Append `token_ids[i]` to row `rows[i]`, in order; a row's tokens are consecutive
        in the lists (one step's tokens: the whole batch at once)."""
        if not rows:
            return
        r = np.asarray(rows, dtype=np.int64)
        if len(rows) == len(set(rows)):  # a token per row (every decode step): no grouping
            self.token_ids[r, self.num_tokens[r]] = token_ids
            self.num_tokens[r] += 1
            return
        first = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])  # each row's first entry
        counts = np.diff(np.r_[first, len(r)])
        offsets = np.arange(len(r)) - np.repeat(first, counts)
        self.token_ids[r, self.num_tokens[r] + offsets] = token_ids
        self.num_tokens[r[first]] += counts

    def condense(self) -> None:
        """Fill holes with the last live rows so rows 0..len-1 are the live requests."""
        live = len(self.req_id_to_row)
        holes = sorted(h for h in self._holes if h < live)
        self._holes = []
        src = self.num_rows - 1
        for hole in holes:
            # Exactly len(holes) live rows sit at index >= live: move them down, last first.
            while self.states[src] is None:
                src -= 1
            self._move_row(src, hole)
            src -= 1
        self.num_rows = live

    def _move_row(self, src: int, dst: int) -> None:
        """Move every per-row value of `src` to `dst` (invariant 4: all of it, at once)."""
        n = int(self.num_tokens[src])
        self.token_ids[dst, :n] = self.token_ids[src, :n]
        self.num_tokens[dst] = n
        nb = int(self.num_blocks[src])
        self.block_table[dst, :nb] = self.block_table[src, :nb]
        self.num_blocks[dst] = nb
        state = self.states[src]
        self.states[dst] = state
        self.states[src] = None
        assert state is not None  # internal invariant: only live rows move
        self.req_id_to_row[state.req_id] = dst
