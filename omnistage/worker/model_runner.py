"""`ModelRunner`: executes one scheduled step on a model and samples.

Per step (`execute_model`):
  update the requests the runner holds from the `SchedulerOutput` (drop ended
  and preempted ones, add new ones, extend block tables) → build the flat
  inputs and the attention metadata (worker/step_inputs.py) and, where rows
  carry more than token ids, the input embeddings (worker/input_embeds.py) →
  forward in a forward context → logits of the rows that sample → the sampling
  dispatch (worker/sampling_dispatch.py) → append the sampled tokens to each
  request's real history → `ModelRunnerOutput`. The forward is the platform's
  `StepForward` (worker/step_forward.py: eager, or CUDA graphs of decode steps).

The runner is the one owner of what it holds per request; the parts above are
composed once at construction and each follows the requests it cares about.
Platform runners (CPU, CUDA) subclass this for device details only and never
replace the sampling dispatch (seeds/001: a platform runner that skipped it).
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

import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from omnistage.core.multimodal_inputs import MultimodalDecoderInputs
from omnistage.core.sched_output import ModelRunnerOutput, NewRequestData, SchedulerOutput
from omnistage.core.tensor_blob import TensorBlob, blob_to_tensor, tensor_to_blob
from omnistage.layers.attention_backend import TORCH_ATTENTION, AttentionBackend
from omnistage.layers.recurrent_state import RecurrentLayerState
from omnistage.models.base import CausalLM
from omnistage.sample.stage_transitions import StageTransitions
from omnistage.spec_decode.config import SpeculativeConfig
from omnistage.spec_decode.proposer import Proposer
from omnistage.worker.flat_layout import FlatLayout
from omnistage.worker.input_batch import InputBatch, RequestState
from omnistage.worker.input_embeds import InputEmbeds
from omnistage.worker.recurrent import RecurrentSlots, commit_accepted
from omnistage.worker.sample_observer import SampleObserver
from omnistage.worker.sampling_dispatch import SampledRows, SamplingDispatch
from omnistage.worker.step_forward import StepForward, eager_forward
from omnistage.worker.step_inputs import StepInputBuilder, StepInputs


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
        attention_backend: AttentionBackend = TORCH_ATTENTION,
        step_forward: StepForward = eager_forward,
    ) -> None:
        if speculative is not None and model.num_token_codes > 0:
            raise ValueError(
                "speculative_config: not available for models that sample extra codes per token"
            )
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self.eos_token_id = eos_token_id
        self.model.bind_kv_cache(kv_caches)
        self.forward = step_forward
        """How a step calls the model (eager, or the platform's: CUDA graphs of decodes)."""
        max_blocks = -(-max_model_len // block_size)
        self.batch = InputBatch(max_num_reqs, max_model_len, max_blocks)
        self.requests: dict[str, RequestState] = {}
        self.recurrent = RecurrentSlots(max_num_reqs) if model.has_recurrent_state else None
        """State slots of the requests held (models with recurrent layers), by request id."""
        self.step_inputs = StepInputBuilder(
            self.batch, block_size, device, self.recurrent, attention_backend
        )
        self.embeds = InputEmbeds(model, self.batch, device)
        self.sampling = SamplingDispatch(model, device, stage_transitions)
        self.busy_seconds = 0.0
        """Time spent executing steps (telemetry: how loaded the runner is)."""
        self.output_hidden_states = output_hidden_states
        self.max_model_len = max_model_len
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
        self.sampling.observers = [*self.sampling.observers, observer]
        return observer

    def remove_sample_observer(self, observer: SampleObserver) -> None:
        """Stop calling `observer` (one installation of it; a no-op if none is left)."""
        observers = list(self.sampling.observers)
        if observer in observers:
            observers.remove(observer)
        self.sampling.observers = observers

    @contextmanager
    def observing_samples(self, observer: SampleObserver) -> Iterator[SampleObserver]:
        """`add_sample_observer` for the duration of a block."""
        self.add_sample_observer(observer)
        try:
            yield observer
        finally:
            self.remove_sample_observer(observer)

    # -- what the proposers read (spec_decode.proposer.DraftHost) ------------------------------
    def flat_layout(self, rows: np.ndarray, start: np.ndarray, n: np.ndarray) -> FlatLayout:
        """The layout of a pass over `n[i]` tokens of row `rows[i]` from position `start[i]`
        (the step's, or a draft model's / MTP layer's pass over the same blocks)."""
        return self.step_inputs.flat_layout(rows, start, n)

    def drafts_allowed(self, req_id: str) -> bool:
        """False for a request whose inputs are more than token ids (input embeddings, 3-D
        positions): no drafts for it."""
        return req_id not in self.embeds.own and req_id not in self.step_inputs.mrope

    # -- the requests held --------------------------------------------------------------------
    def _update_states(self, so: SchedulerOutput) -> None:
        for req_id in so.finished_req_ids | so.preempted_req_ids:
            self.requests.pop(req_id, None)
            self.step_inputs.forget(req_id)
            self.embeds.forget(req_id)
            self.batch.remove(req_id)
            if self.recurrent is not None:
                self.recurrent.remove(req_id)
        for new in so.scheduled_new_reqs:
            if self.recurrent is not None:
                self.recurrent.add(new.req_id)
            state = self._request_state(new)
            self.step_inputs.track(state)
            self.embeds.track(state)
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

    def _request_state(self, new: NewRequestData) -> RequestState:
        """The runner's state of a request it has not held (or lost on preemption)."""
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
        state.output_codes.extend(list(c) for c in new.output_codes)  # sampling_row's list
        if new.mm_decoder_inputs is not None:
            state.mm_decoder_inputs = MultimodalDecoderInputs.from_data(
                new.mm_decoder_inputs, self.device, self.model.dtype
            )
        return state

    def _rows(self, blob: TensorBlob | None) -> torch.Tensor:
        if blob is None:
            width = self.model.input_width
            return torch.zeros(0, width, dtype=self.model.dtype, device=self.device)
        return blob_to_tensor(blob).to(self.device, self.model.dtype)

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
        inputs = self.step_inputs.build(so)
        embeds = self.embeds.prompt_embeds(inputs)
        deepstack = self.embeds.deepstack_rows(inputs) if self.embeds.deepstack else None
        hidden = self.forward(self.model, inputs, embeds, deepstack)
        step = SampledRows({}, {}, {})
        if inputs.sample_rows:
            logits = self.model.compute_logits(hidden[inputs.logits_indices])
            step = self.sampling.sample(
                logits,
                self.batch.states,
                inputs.sample_rows,
                inputs.drafts,
                inputs.sample_outputs_before,
            )
            if step.accepted is not None:
                self._commit_recurrent_states(inputs.sample_rows, inputs.drafts, step.accepted)
        starts = [self.batch.states[r].num_computed_tokens for r in inputs.rows]
        output = self._finish_step(inputs, step)
        if self.output_hidden_states:
            self._add_hidden_states(output, inputs, hidden, starts)
        if self.proposer is not None:
            output.proposed_drafts = self._propose_drafts(inputs, step, hidden)
        return output

    def _add_hidden_states(
        self, output: ModelRunnerOutput, inputs: StepInputs, hidden: torch.Tensor, starts: list[int]
    ) -> None:
        """The step's hidden-state rows of the positions it computed for good: a request's
        first `kept` rows, `kept` being how far its computed count moved (a rejected
        draft's position is computed again later, and only that row counts)."""
        kept = [
            self.batch.states[r].num_computed_tokens - s
            for r, s in zip(inputs.rows, starts, strict=True)
        ]
        rows = self.model.stage_hidden_states(hidden)
        if sum(kept) != rows.shape[0]:
            firsts = np.cumsum(inputs.row_counts) - np.asarray(inputs.row_counts)
            index = np.concatenate([np.arange(f, f + k) for f, k in zip(firsts, kept, strict=True)])
            rows = rows[torch.from_numpy(index).to(rows.device)]
        output.hidden_states = tensor_to_blob(rows)
        output.hidden_starts = starts
        output.hidden_counts = kept

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
