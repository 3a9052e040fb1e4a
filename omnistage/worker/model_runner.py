"""`ModelRunner`: executes one scheduled step on a model and samples.

Per step (`execute_model`):
  update the persistent batch from the `SchedulerOutput` (drop ended and
  preempted requests, add new ones, extend block tables) → build the flat
  inputs and the attention metadata → forward in a forward context → logits
  of the rows that sample → sampling → append the sampled tokens to each
  request's real history → `ModelRunnerOutput`.

Sampling dispatch is written here, once: logits processors, then the model's
own `sample()` when it prefers it, then the default sampler. Platform runners
(CPU, CUDA) subclass this for device details only and must not override
`_sample` (seeds/001: a platform runner that skipped the dispatch).

What was sampled is observed through `add_sample_observer`
(worker/sample_observer.py), never by wrapping the runner's methods.

Speculative decoding: the runner owns each request's drafts (proposed at the
end of a step, kept in its `RequestState`, never by row) and its true
`num_computed_tokens`. A decoding request scheduled with draft slots feeds
its newest token and up to that many drafts; the target's token is sampled at
each of those positions through the same dispatch, each position seeing the
history it would have (spec_decode/verify.py), and the drafts that match are
accepted. Rejected positions are simply not counted as computed. Proposers
(spec_decode/) read the runner through `spec_decode.proposer.DraftHost`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from omnistage.core.multimodal_inputs import MultimodalDecoderInputs
from omnistage.core.sched_output import ModelRunnerOutput, SchedulerOutput
from omnistage.core.tensor_blob import TensorBlob, blob_to_tensor, tensor_to_blob
from omnistage.models.base import CausalLM, DeepstackRows
from omnistage.sample import (
    Sampler,
    SamplingMetadata,
    apply_logits_processors,
    compute_logprobs,
    gather_logprobs,
)
from omnistage.sample.stage_transitions import StageTransitions
from omnistage.spec_decode.config import SpeculativeConfig
from omnistage.spec_decode.proposer import Proposer
from omnistage.spec_decode.verify import accepted_counts
from omnistage.worker.attention import AttentionMetadata
from omnistage.worker.flat_layout import FlatLayout, build_flat_layout
from omnistage.worker.forward_context import forward_context
from omnistage.worker.input_batch import InputBatch, RequestState
from omnistage.worker.recurrent import RecurrentLayerState, RecurrentSlots, commit_accepted
from omnistage.worker.sample_observer import SampleEvent, SampleObserver


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    attn: AttentionMetadata
    rows: list[int]
    """Batch rows scheduled this step, in flat order."""
    row_counts: list[int]
    """Tokens of each of those rows this step."""
    sample_rows: list[int]
    """Rows that sample a token this step (their prompt is fully computed)."""
    logits_indices: torch.Tensor
    """Flat index of the last token of each sampling row (of its last 1 + len(drafts)
    tokens when it verifies drafts)."""
    drafts: dict[int, list[int]]
    """Rows that verify drafts this step: the drafts, fed after their newest token."""


@dataclass
class SampledRows:
    """What one step sampled, by batch row: one token, or with drafts the accepted ones
    and the target's token after them."""

    tokens: dict[int, list[int]]
    codes: dict[int, list[int]]
    """Models with `num_token_codes`: the codes sampled with each row's token."""
    logprobs: dict[int, list[tuple[list[int], list[float], int]]]


class ModelRunner:
    """Platform-independent runner; subclasses set the device details."""

    def __init__(
        self,
        model: CausalLM,
        kv_caches: list[torch.Tensor],
        block_size: int,
        max_num_reqs: int,
        max_model_len: int,
        eos_token_id: int | None,
        device: torch.device,
        stage_transitions: StageTransitions | None = None,
        output_hidden_states: bool = False,
        speculative: SpeculativeConfig | None = None,
        proposer: Proposer | None = None,
        recurrent_states: list[RecurrentLayerState] | None = None,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self.eos_token_id = eos_token_id
        self.model.bind_kv_cache(kv_caches)
        max_blocks = -(-max_model_len // block_size)
        self.batch = InputBatch(max_num_reqs, max_model_len, max_blocks)
        self.requests: dict[str, RequestState] = {}
        self._own_embeds: set[str] = set()
        """Requests that bring input embeddings (prompt embeddings, conditioning rows)."""
        self._mrope: set[str] = set()
        """Requests with 3-D rotary positions of their prompt or outputs (an empty set: every
        step keeps 1-D positions)."""
        self._deepstack: set[str] = set()
        """Requests with deepstack features."""
        self.sampler = Sampler()
        self.sample_observers: list[SampleObserver] = []
        """Installed sample observers. Replaced, never changed in place, so a step running
        on another thread iterates a list nobody modifies."""
        self.busy_seconds = 0.0
        """Time spent executing steps (telemetry: how loaded the runner is)."""
        self.stage_transitions = stage_transitions
        self.output_hidden_states = output_hidden_states
        self.recurrent = RecurrentSlots(max_num_reqs) if model.has_recurrent_state else None
        """State slots of the requests held (models with recurrent layers), by request id."""
        self.max_model_len = max_model_len
        if speculative is not None and (model.num_token_codes > 0 or output_hidden_states):
            raise ValueError(
                "speculative_config: not available for models that sample extra codes per "
                "token or stages that send hidden states downstream"
            )
        self.speculative = speculative
        self.proposer = proposer
        """Proposes each sampled request's drafts for its next step (see spec_decode/)."""
        self.recurrent_states = recurrent_states
        """The recurrent layers' state (with scratch states under speculation), to commit
        each verifying request's last accepted position."""

    def stats(self) -> dict[str, int]:
        """What the runner holds (batch rows, known requests; zero when idle) and its load."""
        return {
            "batch_rows": len(self.batch),
            "requests": len(self.requests),
            "busy_ms": int(1000 * self.busy_seconds),
        }

    # -- observing ------------------------------------------------------------------------
    def add_sample_observer(self, observer: SampleObserver) -> SampleObserver:
        """Call `observer` with a `SampleEvent` after every step that samples, until it is
        removed; returns it (worker/sample_observer.py)."""
        self.sample_observers = [*self.sample_observers, observer]
        return observer

    def remove_sample_observer(self, observer: SampleObserver) -> None:
        """Stop calling `observer` (one installation of it; a no-op if none is left)."""
        observers = list(self.sample_observers)
        if observer in observers:
            observers.remove(observer)
        self.sample_observers = observers

    @contextmanager
    def observing_samples(self, observer: SampleObserver) -> Iterator[SampleObserver]:
        """`add_sample_observer` for the duration of a block."""
        self.add_sample_observer(observer)
        try:
            yield observer
        finally:
            self.remove_sample_observer(observer)

    def drafts_allowed(self, req_id: str) -> bool:
        """False for a request whose inputs are more than token ids (input embeddings, 3-D
        positions): no drafts for it (spec_decode.proposer.DraftHost)."""
        return req_id not in self._own_embeds and req_id not in self._mrope

    # -- batch bookkeeping ---------------------------------------------------------------
    def _update_states(self, so: SchedulerOutput) -> None:
        for req_id in so.finished_req_ids | so.preempted_req_ids:
            self.requests.pop(req_id, None)
            self._own_embeds.discard(req_id)
            self._mrope.discard(req_id)
            self._deepstack.discard(req_id)
            self.batch.remove(req_id)
            if self.recurrent is not None:
                self.recurrent.remove(req_id)
        for new in so.scheduled_new_reqs:
            if self.recurrent is not None:
                self.recurrent.add(new.req_id)
            state = RequestState(
                req_id=new.req_id,
                prompt_token_ids=list(new.prompt_token_ids),
                output_token_ids=list(new.output_token_ids),
                sampling_params=new.sampling_params,
                sample_seed=new.sample_seed,
                block_ids=list(new.block_ids),
                num_computed_tokens=new.num_computed_tokens,
                draft_num_computed=new.num_computed_tokens,
                eos_token_id=self.eos_token_id,
                prompt_embeds=None
                if new.prompt_embeds is None
                else blob_to_tensor(new.prompt_embeds).to(self.device, self.model.dtype),
            )
            if new.stream_conditioning:
                state.conditioning = self._rows(new.conditioning)
                if new.conditioning_fill is not None:
                    state.conditioning_fill = self._rows(new.conditioning_fill)
            state.output_codes = [list(c) for c in new.output_codes]
            if state.prompt_embeds is not None or state.conditioning is not None:
                self._own_embeds.add(new.req_id)
            if new.mm_decoder_inputs is not None:
                mm = MultimodalDecoderInputs.from_data(
                    new.mm_decoder_inputs, self.device, self.model.dtype
                )
                state.mm_decoder_inputs = mm
                if mm.mrope_positions is not None or mm.decode_positions is not None:
                    self._mrope.add(new.req_id)
                if mm.deepstack_embeds is not None:
                    self._deepstack.add(new.req_id)
            self.requests[new.req_id] = state
            self.batch.add(state)
        for req_id, blob in so.new_conditioning.items():
            state = self.requests[req_id]
            state.conditioning = torch.cat([state.conditioning, self._rows(blob)])
        for req_id, blob in so.new_conditioning_fill.items():
            self.requests[req_id].conditioning_fill = self._rows(blob)
        cached = so.scheduled_cached_reqs
        # The runner's own `num_computed_tokens` is the truth (async speculation: the
        # scheduler's count still includes drafts of the step in flight that were rejected).
        for req_id, new_blocks in zip(cached.req_ids, cached.new_block_ids, strict=True):
            state = self.requests[req_id]
            if new_blocks:
                state.block_ids.extend(new_blocks)
                self.batch.append_blocks(self.batch.req_id_to_row[req_id], new_blocks)
        self.batch.condense()

    # -- inputs ---------------------------------------------------------------------------------
    def _prepare_inputs(self, so: SchedulerOutput) -> StepInputs:
        """Flat token ids, positions, cache slots and attention metadata of the step (numpy)."""
        batch = self.batch
        live = batch.states[: batch.num_rows]
        counts = np.array([so.num_scheduled_tokens.get(s.req_id, 0) for s in live], dtype=np.int64)
        computed = np.array([s.num_computed_tokens for s in live], dtype=np.int64)
        drafts = self._place_drafts(so, counts, computed) if so.scheduled_spec_tokens else {}
        rows = np.flatnonzero(counts)
        n, start = counts[rows], computed[rows]
        layout = self.flat_layout(rows, start, n)
        if self.recurrent is not None:  # verifying rows keep a state per position
            layout.attn.recurrent = self.recurrent.metadata(
                [batch.states[r].req_id for r in rows],
                n.tolist(),
                start.tolist(),
                [1 + len(drafts[r]) if r in drafts else 0 for r in rows.tolist()],
                self.device,
            )
        sampling = start + n >= batch.num_tokens[rows]
        sample_rows = rows[sampling].tolist()
        ends = layout.ends[sampling]
        if drafts:
            widths = [1 + len(drafts.get(r, ())) for r in sample_rows]
            logits_indices = np.concatenate(
                [np.arange(e - w, e) for e, w in zip(ends, widths, strict=True)]
            )
        else:
            logits_indices = ends - 1
        pos = layout.positions
        return StepInputs(
            input_ids=torch.from_numpy(batch.token_ids[layout.tok_rows, pos]).to(self.device),
            positions=torch.from_numpy(
                self._rotary_positions(rows, layout.first, n, start, pos) if self._mrope else pos
            ).to(self.device),
            attn=layout.attn,
            rows=rows.tolist(),
            row_counts=n.tolist(),
            sample_rows=sample_rows,
            logits_indices=torch.from_numpy(logits_indices).to(self.device),
            drafts=drafts,
        )

    def _place_drafts(
        self, so: SchedulerOutput, counts: np.ndarray, computed: np.ndarray
    ) -> dict[int, list[int]]:
        """Rows given draft slots: feed up to that many of the drafts they hold, written
        past their history in the token rows (never into it); `counts` shrinks to what
        is fed. Returns the drafts each such row verifies."""
        placed: dict[int, list[int]] = {}
        for req_id, slots in so.scheduled_spec_tokens.items():
            row = self.batch.req_id_to_row[req_id]
            state = self.batch.states[row]
            num_tokens = int(self.batch.num_tokens[row])
            if computed[row] != num_tokens - 1 or computed[row] < len(state.prompt_token_ids):
                drafts = []  # not decoding yet (async: its prompt's last token is in this step)
            else:
                drafts = state.draft_token_ids[:slots]
            counts[row] = min(counts[row], num_tokens - computed[row]) + len(drafts)
            if drafts:
                self.batch.token_ids[row, num_tokens : num_tokens + len(drafts)] = drafts
                placed[row] = drafts
        return placed

    def flat_layout(self, rows: np.ndarray, start: np.ndarray, n: np.ndarray) -> FlatLayout:
        """The layout of a pass over `n[i]` tokens of row `rows[i]` from position `start[i]`
        (the step's, or a draft model's / MTP layer's pass over the same blocks)."""
        return build_flat_layout(
            self.batch.block_table, self.block_size, self.device, rows, start, n
        )

    def _rotary_positions(
        self,
        rows: np.ndarray,
        first: np.ndarray,
        counts: np.ndarray,
        starts: np.ndarray,
        pos: np.ndarray,
    ) -> np.ndarray:
        """Rotary positions of the step's tokens when some request has 3-D positions: a
        prompt token `i` of such a request takes `mrope_positions[:, i]`, a generated token
        `j` `decode_positions[:, j]` (GLM-Image) or else its sequence index plus
        `rope_delta`, every other token its sequence index. [3, T] when a scheduled token
        takes 3-D positions, else [T] (Qwen decode steps stay 1-D)."""
        out, parts = pos, []
        for req_id in self._mrope:
            row = self.batch.req_id_to_row[req_id]
            i = int(np.searchsorted(rows, row))
            if i == len(rows) or rows[i] != row:
                continue  # not scheduled this step
            state = self.batch.states[row]
            mm = state.mm_decoder_inputs
            f, n, s = int(first[i]), int(counts[i]), int(starts[i])
            length = len(state.prompt_token_ids)
            if s < length and mm.mrope_positions is not None:
                parts.append((f, mm.mrope_positions[:, s : min(s + n, length)]))
            if s + n <= length:
                continue
            out_at = f + max(length - s, 0)  # flat index of the first generated token
            if mm.decode_positions is not None:
                parts.append((out_at, mm.output_positions(max(s - length, 0), f + n - out_at)))
            elif mm.rope_delta:
                if out is pos:
                    out = pos.copy()
                out[out_at : f + n] += mm.rope_delta
        if not parts:
            return out
        out = np.repeat(out[None], 3, axis=0)
        for at, positions in parts:
            out[:, at : at + positions.shape[1]] = positions.numpy()
        return out

    def _deepstack_rows(self, inputs: StepInputs) -> DeepstackRows | None:
        """The deepstack features of the step's prompt tokens at visual positions (a chunk
        `[s, e)` of a prompt takes the visual rows between the mask's counts before `s`
        and before `e`); None when no scheduled token has any. A request whose prompt is
        done leaves `_deepstack` and drops its features (a recompute brings them again)."""
        spans, at = {}, 0
        for row, n in zip(inputs.rows, inputs.row_counts, strict=True):
            spans[row] = (at, n)
            at += n
        flat, feats, done = [], [], []
        for req_id in self._deepstack:
            row = self.batch.req_id_to_row[req_id]
            if row not in spans:
                continue  # not scheduled this step
            mm = self.batch.states[row].mm_decoder_inputs
            mask, (offset, n) = mm.visual_pos_mask, spans[row]
            start = self.batch.states[row].num_computed_tokens
            if start + n >= mask.shape[0]:
                done.append(req_id)
            local = mask[start : start + n].nonzero().flatten()
            if len(local):
                before = int(mask[:start].sum())
                flat.append(local + offset)
                feats.append(mm.deepstack_embeds[:, before : before + len(local)])
        for req_id in done:
            self._deepstack.discard(req_id)
            mm = self.batch.states[self.batch.req_id_to_row[req_id]].mm_decoder_inputs
            mm.visual_pos_mask = mm.deepstack_embeds = None
        if not flat:
            return None
        layers = max(f.shape[0] for f in feats)
        if any(f.shape[0] != layers for f in feats):  # requests may differ: pad with zeros
            feats = [torch.cat([f, f.new_zeros(layers - len(f), *f.shape[1:])]) for f in feats]
        return DeepstackRows(rows=torch.cat(flat).to(self.device), embeds=torch.cat(feats, dim=1))

    # -- the step -----------------------------------------------------------------------------------
    @torch.inference_mode()
    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        started = time.perf_counter()
        try:
            return self._execute(so)
        finally:
            self.busy_seconds += time.perf_counter() - started

    def _execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        self._update_states(so)
        if so.total_num_scheduled_tokens == 0:
            return ModelRunnerOutput(req_ids=[], sampled_token_ids=[], logprobs=[])
        inputs = self._prepare_inputs(so)
        embeds = self._prompt_embeds(inputs)
        deepstack = self._deepstack_rows(inputs) if self._deepstack else None
        with forward_context(inputs.attn):
            if deepstack is None:
                hidden = self.model(inputs.input_ids, inputs.positions, embeds)
            else:
                hidden = self.model(inputs.input_ids, inputs.positions, embeds, deepstack=deepstack)
        step = SampledRows({}, {}, {})
        if inputs.sample_rows:
            logits = self.model.compute_logits(hidden[inputs.logits_indices])
            step = self._sample(logits, inputs.sample_rows, inputs.drafts)
        starts = [self.batch.states[r].num_computed_tokens for r in inputs.rows]
        output = self._finish_step(inputs, step)
        if self.output_hidden_states:
            output.hidden_states = tensor_to_blob(self.model.stage_hidden_states(hidden))
            output.hidden_starts = starts
        if self.proposer is not None:
            output.proposed_drafts = self._propose_drafts(inputs, step, hidden)
        return output

    def _rows(self, blob: TensorBlob | None) -> torch.Tensor:
        if blob is None:
            width = self.model.input_width
            return torch.zeros(0, width, dtype=self.model.dtype, device=self.device)
        return blob_to_tensor(blob).to(self.device, self.model.dtype)

    def _prompt_embeds(self, inputs: StepInputs) -> torch.Tensor | None:
        """Input embeddings of the step when a scheduled request brings its own (prompt
        embeddings, conditioning rows) or the model embeds its tokens' codes, else None:
        the model embeds the token ids."""
        with_codes = self.model.num_token_codes > 0
        if not self._own_embeds and not with_codes:  # the common case: no row is touched
            return None
        embeds = self.model.embed_input_ids(inputs.input_ids)
        offset = 0
        for row, n in zip(inputs.rows, inputs.row_counts, strict=True):
            state = self.batch.states[row]
            start, prompt_len = state.num_computed_tokens, len(state.prompt_token_ids)
            if state.prompt_embeds is not None:
                stop = min(start + n, prompt_len)
                if stop > start:
                    embeds[offset : offset + stop - start] = state.prompt_embeds[start:stop]
            # Positions past the prompt hold output tokens: output `first - prompt_len` first.
            first, last = max(start, prompt_len), start + n
            if first < last:
                out = embeds[offset + first - start : offset + last - start]
                self._add_output_rows(state, out, first - prompt_len)
            offset += n
        return embeds

    def _add_output_rows(self, state: RequestState, out: torch.Tensor, first: int) -> None:
        """Add to the input embeddings `out` of outputs `first, first + 1, ...` their
        conditioning rows (then the fill row) and the embeddings of their extra codes."""
        count = out.shape[0]
        if state.conditioning is not None:
            rows = state.conditioning[first : first + count]
            out[: rows.shape[0]] += rows
            if state.conditioning_fill is not None and rows.shape[0] < count:
                out[rows.shape[0] :] += state.conditioning_fill
        if self.model.num_token_codes > 0:
            codes = state.output_codes[first : first + count]
            if codes:
                ids = torch.tensor(codes, dtype=torch.long, device=out.device)
                out[: len(codes)] += self.model.embed_token_codes(ids)

    def _sampling_metadata(self, rows: list[int], drafts: dict[int, list[int]]) -> SamplingMetadata:
        """One sampling row per sampled position: a row verifying drafts samples after its
        newest token and after each draft, position `j` seeing the history plus the first
        `j` drafts (what it would be had they been sampled)."""
        entries = []
        for r in rows:
            s = self.batch.states[r]
            entries.append(s.sampling_row)
            for j in range(1, len(drafts.get(r, ())) + 1):
                entries.append(
                    dataclasses.replace(
                        s.sampling_row, output_token_ids=s.output_token_ids + drafts[r][:j]
                    )
                )
        return SamplingMetadata.from_requests(entries, self.device)

    def _sample(
        self, logits: torch.Tensor, rows: list[int], drafts: dict[int, list[int]] | None = None
    ) -> SampledRows:
        """The one sampling dispatch of every platform: processors → model sampler → default,
        then draft verification (spec_decode/verify.py) for rows that bring drafts.

        A model with `num_token_codes` samples in its own `sample()` and returns, per row,
        the token then its codes."""
        drafts = drafts or {}
        md = self._sampling_metadata(rows, drafts)
        observers = self.sample_observers
        raw = logits.clone() if observers else None  # processors change `logits` in place
        raw_logprobs = compute_logprobs(logits, md) if md.max_num_logprobs is not None else None
        logits = apply_logits_processors(logits, md)
        if self.stage_transitions is not None:
            self.stage_transitions.apply(logits, md.output_token_ids)
        tokens = None
        if self.model.prefer_model_sampler:
            tokens = self.model.sample(logits, md)
        if tokens is None:
            tokens = self.sampler(logits, md)
        if observers:
            event = SampleEvent(
                md.req_ids,
                raw,
                tokens[:, 0] if tokens.ndim == 2 else tokens,
                tokens[:, 1:] if tokens.ndim == 2 else None,
            )
            for observer in observers:
                observer(event)
        codes: dict[int, list[int]] = {}
        if tokens.ndim == 2:  # token, then its codes (never with drafts)
            codes = dict(zip(rows, tokens[:, 1:].tolist(), strict=True))
            tokens = tokens[:, 0]
        flat = tokens.tolist()
        sampled: dict[int, list[int]] = {}
        picks: list[tuple[int, int]] = []  # (row, flat sampling row) of each emitted token
        accepted = None
        if drafts:
            accepted = accepted_counts(tokens, [drafts.get(r, []) for r in rows])
            self._commit_recurrent_states(rows, drafts, accepted)
        num_accepted = accepted.tolist() if accepted is not None else [0] * len(rows)
        at = 0
        for row, a in zip(rows, num_accepted, strict=True):
            sampled[row] = flat[at : at + a + 1]
            picks.extend((row, at + j) for j in range(a + 1))
            at += len(drafts.get(row, ())) + 1
        logprobs: dict[int, list[tuple[list[int], list[float], int]]] = {}
        if raw_logprobs is not None:
            ids, lps, ranks = gather_logprobs(raw_logprobs, tokens, md.max_num_logprobs)
            for row, i in picks:
                k = self.batch.states[row].sampling_params.logprobs
                if k is not None:
                    logprobs.setdefault(row, []).append(
                        (ids[i, : k + 1].tolist(), lps[i, : k + 1].tolist(), int(ranks[i]))
                    )
        return SampledRows(sampled, codes, logprobs)

    def _commit_recurrent_states(
        self, rows: list[int], drafts: dict[int, list[int]], accepted: torch.Tensor
    ) -> None:
        """Recurrent layers: each verifying request continues from the state after its last
        accepted position (its newest token, then `accepted` drafts), found by that
        request's slot and its own accepted count of this step (seeds/004)."""
        if self.recurrent_states is None:
            return
        verifying = [i for i, r in enumerate(rows) if r in drafts]
        slots = torch.tensor(
            [self.recurrent.slot_of(self.batch.states[rows[i]].req_id) for i in verifying],
            dtype=torch.int64,
            device=self.device,
        )
        index = torch.tensor(verifying, dtype=torch.int64, device=accepted.device)
        commit_accepted(self.recurrent_states, slots, accepted[index].to(self.device))

    def _finish_step(self, inputs: StepInputs, step: SampledRows) -> ModelRunnerOutput:
        """Record sampled tokens (and codes) in each request's real history (sync: right
        away; async: before the next step reads it) and advance what the runner counts as
        computed (a rejected draft's position is not)."""
        req_ids, tokens, lps = [], [], []
        codes: list[list[int]] | None = [] if self.model.num_token_codes > 0 else None
        verified: list[int] | None = [] if self.speculative is not None else None
        appended_rows: list[int] = []
        appended: list[int] = []
        for row, n in zip(inputs.rows, inputs.row_counts, strict=True):
            state = self.batch.states[row]
            req_ids.append(state.req_id)
            row_tokens = step.tokens.get(row, [])
            num_drafts = len(inputs.drafts.get(row, ()))
            state.num_computed_tokens += n - num_drafts + max(len(row_tokens) - 1, 0)
            if row_tokens:
                state.output_token_ids.extend(row_tokens)
                appended_rows.extend([row] * len(row_tokens))
                appended.extend(row_tokens)
            tokens.append(row_tokens)
            lps.append(step.logprobs.get(row))
            if verified is not None:
                verified.append(num_drafts)
            if codes is not None:
                row_codes = step.codes.get(row, [])
                if row_codes:
                    state.output_codes.append(row_codes)
                codes.append(row_codes)
        self.batch.append_tokens(appended_rows, appended)
        return ModelRunnerOutput(
            req_ids=req_ids,
            sampled_token_ids=tokens,
            logprobs=lps,
            sampled_codes=codes,
            verified_drafts=verified,
        )

    def _propose_drafts(
        self, inputs: StepInputs, step: SampledRows, hidden: torch.Tensor
    ) -> list[int]:
        """Propose the next step's drafts of every request that sampled (each keeps them in
        its own state); returns per scheduled request how many it holds. `hidden`: the
        step's final hidden states (an MTP proposer continues from them)."""
        assert self.speculative is not None  # internal: a proposer comes with its config
        wanted: dict[int, int] = {}
        for row in step.tokens:
            state = self.batch.states[row]
            state.draft_token_ids = []
            if not self.drafts_allowed(state.req_id):
                continue  # positions carry more than a token id: no drafts for them
            room = self.max_model_len - int(self.batch.num_tokens[row]) - 1
            wanted[row] = min(self.speculative.num_speculative_tokens, room)
        proposals = self.proposer.propose(self, inputs, wanted, hidden)
        for row, drafts in proposals.items():
            self.batch.states[row].draft_token_ids = drafts
        return [len(self.batch.states[r].draft_token_ids) for r in inputs.rows]
