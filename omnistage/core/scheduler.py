"""`Scheduler`: decides, each step, which requests compute how many tokens.

One scheduling model, no prefill or decode phases (vLLM v1): every request has
`num_tokens_with_placeholders - num_computed_tokens` tokens to compute, and
each step gives requests some of them within the token budget
(`max_num_batched_tokens`) and `max_num_seqs`. Prompts longer than the
remaining budget are chunked. Running requests go first, in arrival order;
when KV blocks run out, the most recently arrived running request is
preempted (its blocks freed, recomputed later). Waiting requests are admitted
FCFS, taking prefix-cache hits.

After scheduling, `num_computed_tokens` is advanced as if the step had run;
`_on_scheduled` is the hook where the async subclass counts placeholders.
`update_from_output` appends the sampled tokens and applies the stop rules
(`stop_rules.py`). Rows of stream-conditioned requests reach the runner
through the `ConditioningFeed` (`conditioning.py`).

Speculative decoding: a decoding request also gets draft slots (up to
`num_speculative_tokens`; synchronously, as many as the runner proposed for it).
The runner fills them with its own drafts and verifies them; a step that
accepts `a` of `k` drafts computed `k - a` positions in vain, so
`num_computed_tokens` goes back by that much when its tokens arrive.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import torch

from omnistage.config import EngineConfig
from omnistage.core.conditioning import ConditioningFeed
from omnistage.core.engine_core_output import EngineCoreOutput
from omnistage.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
from omnistage.core.request import Request, RequestStatus
from omnistage.core.sched_output import (
    CachedRequestData,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from omnistage.core.step_isolation import StepIsolation
from omnistage.core.stop_rules import append_and_check_stop
from omnistage.core.tensor_blob import TensorBlob, blob_to_tensor, tensor_to_blob
from omnistage.core.token_budget import TokenBudget
from omnistage.spec_decode.stats import SpecDecodeStats


class Scheduler:
    """Synchronous scheduler: step N+1 is scheduled after step N's tokens are known."""

    def __init__(self, config: EngineConfig, kv_cache_manager: KVCacheManager) -> None:
        if config.max_model_len is None or config.max_num_batched_tokens is None:
            raise ValueError("Scheduler needs a config resolved for its model")
        self.config = config
        self.max_model_len: int = config.max_model_len
        self.token_budget: int = config.max_num_batched_tokens
        self.kv = kv_cache_manager
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._finished_since_last_step: set[str] = set()
        self._preempted_since_last_step: set[str] = set()
        self.isolation = StepIsolation()
        """After a failed step: its requests run alone until one is blamed (`step_isolation`)."""
        self.num_preemptions = 0
        """Preemptions since start (for stats and tests)."""
        self.conditioning = ConditioningFeed()
        """What stream-conditioned requests' runners have not been sent yet."""
        spec = config.speculative
        self.num_spec_tokens = 0 if spec is None else spec.num_speculative_tokens
        """Draft slots a decoding request may get per step (0: no speculation)."""
        self.num_lookahead_slots = 0 if spec is None else spec.num_lookahead_slots
        """KV slots allocated past a step's tokens (a draft model writes its drafts there)."""
        self.spec_stats = SpecDecodeStats(self.num_spec_tokens)
        """Speculation totals since start (drafts, accepted, per draft position)."""

    # -- request lifecycle -----------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request_id: {request.request_id!r} is already running")
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> None:
        """End requests from outside (abort, stop string): free everything they hold."""
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is None or request.is_finished:
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
            request.status = status
            self._release(request)

    def preempt_running(self) -> None:
        """Preempt every running request (after a failed step the runner's state of them is
        unknown); they keep their confirmed tokens and are recomputed, in running order."""
        for request in reversed(self.running):
            self._preempt(request)
            self._preempted_since_last_step.add(request.request_id)
        self.running.clear()

    def _release(self, request: Request) -> None:
        self.conditioning.discard(request.request_id)
        self.kv.free(request)
        del self.requests[request.request_id]
        self._finished_since_last_step.add(request.request_id)

    @property
    def num_unfinished_requests(self) -> int:
        return len(self.requests)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # -- scheduling --------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        budget = TokenBudget(self.token_budget)
        new_reqs: list[NewRequestData] = []
        cached_reqs = CachedRequestData()
        preempted: set[str] = set()
        new_conditioning: dict[str, TensorBlob] = {}
        new_fill: dict[str, TensorBlob] = {}
        self._bring_focus_forward()
        self._schedule_running(budget, cached_reqs, preempted, new_conditioning, new_fill)
        if not preempted:
            self._schedule_waiting(budget, new_reqs)
        if self._preempted_since_last_step:  # after a failed step (`preempt_running`)
            preempted |= self._preempted_since_last_step
            self._preempted_since_last_step = set()
        out = SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached_reqs,
            num_scheduled_tokens=budget.scheduled,
            total_num_scheduled_tokens=budget.used,
            finished_req_ids=self._finished_since_last_step,
            preempted_req_ids=preempted,
            new_conditioning=new_conditioning,
            new_conditioning_fill=new_fill,
        )
        self._finished_since_last_step = set()
        for req_id, n in budget.scheduled.items():
            self._on_scheduled(self.requests[req_id], n, budget.spec.get(req_id, 0))
        out.scheduled_spec_tokens = budget.spec
        return out

    def _bring_focus_forward(self) -> None:
        """A suspect of a failed step that waits goes first (it runs alone)."""
        focus = self.isolation.focus(self.requests)
        if focus is not None and self.waiting and self.waiting[0].request_id != focus:
            request = self.requests[focus]
            if request in self.waiting:
                self.waiting.remove(request)
                self.waiting.appendleft(request)

    def _tokens_to_compute(self, request: Request) -> int:
        pending = request.num_tokens + request.num_output_placeholders
        limit = request.conditioned_positions_limit
        if limit is not None:  # wait for the conditioning rows of the next positions
            pending = min(pending, limit)
        return min(pending, self.max_model_len) - request.num_computed_tokens

    def add_conditioning(
        self,
        request_id: str,
        rows: torch.Tensor,
        finished: bool,
        fill: torch.Tensor | None = None,
    ) -> None:
        """More conditioning rows for a stream-conditioned request (ignored once it ended);
        with `finished`, `fill` is the row of every later position."""
        request = self.requests.get(request_id)
        if request is not None:
            self.conditioning.add(request, rows, finished, fill)

    def _schedule_running(
        self,
        budget: TokenBudget,
        cached_reqs: CachedRequestData,
        preempted: set[str],
        new_conditioning: dict[str, TensorBlob],
        new_fill: dict[str, TensorBlob],
    ) -> None:
        i = 0
        while i < len(self.running) and budget.left > 0:
            request = self.running[i]
            n = min(self._tokens_to_compute(request), budget.left)
            if n <= 0 or not self.isolation.admits(request.request_id):
                i += 1
                continue
            spec = 0
            if n == 1 and self.num_spec_tokens and self._is_decoding(request):
                spec = min(self._num_draft_slots(request), budget.left - 1)
            slots = n + spec + self.num_lookahead_slots
            new_block_ids: list[int] = []
            if not self.kv.covers(request, slots):  # else: nothing to allocate (most decodes)
                if not self._make_room(request, slots, preempted):
                    break  # the request itself was preempted
                held_before = self.kv.num_blocks(request.request_id)
                self.kv.allocate_slots(request, slots)
                new_block_ids = self.kv.block_ids(request.request_id, held_before)
            cached_reqs.add(request.request_id, new_block_ids, request.num_computed_tokens)
            budget.take(request.request_id, n + spec, spec)
            self.conditioning.collect(request, new_conditioning, new_fill)
            i += 1

    @staticmethod
    def _is_decoding(request: Request) -> bool:
        """Past its prompt, with only its newest token to compute: drafts may follow it."""
        return request.num_computed_tokens >= request.num_prompt_tokens

    def _draft_limit(self, request: Request) -> int:
        """Most drafts worth verifying: every one accepted (plus the bonus token) must stay
        within max_tokens and max_model_len."""
        in_flight = request.num_output_placeholders
        return max(
            0,
            min(
                self.num_spec_tokens,
                request.max_tokens - request.num_output_tokens - in_flight - 1,
                self.max_model_len - request.num_tokens - in_flight - 1,
            ),
        )

    def _num_draft_slots(self, request: Request) -> int:
        """Draft slots for this step: as many as the runner proposed (known synchronously)."""
        return min(request.num_proposed_drafts, self._draft_limit(request))

    def _make_room(self, request: Request, n: int, preempted: set[str]) -> bool:
        """Preempt from the tail of `running` until `request` fits; False if it was preempted."""
        while not self.kv.can_allocate(request, n):
            victim = self.running.pop()
            self._preempt(victim)
            preempted.add(victim.request_id)
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request) -> None:
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_output_placeholders = 0
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def _schedule_waiting(self, budget: TokenBudget, new_reqs: list[NewRequestData]) -> None:
        while self.waiting and budget.left > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            if not self.isolation.admits(request.request_id):
                break
            computed, num_hit = self.kv.get_computed_blocks(request)
            n = request.num_tokens - num_hit
            if not self.config.enable_chunked_prefill and n > budget.left:
                break
            n = min(n, budget.left)
            if not self.kv.can_allocate(request, n + self.num_lookahead_slots, computed):
                break
            self._admit(request, n, computed, num_hit)
            conditioning, fill = self.conditioning.for_new(request)
            new_reqs.append(
                NewRequestData(
                    req_id=request.request_id,
                    prompt_token_ids=request.prompt_token_ids,
                    output_token_ids=list(request.output_token_ids),
                    sampling_params=request.sampling_params,
                    sample_seed=request.sample_seed,
                    block_ids=self.kv.block_ids(request.request_id),
                    num_computed_tokens=num_hit,
                    prompt_embeds=None
                    if request.prompt_embeds is None
                    else tensor_to_blob(request.prompt_embeds),
                    mm_decoder_inputs=None
                    if request.mm_decoder_inputs is None
                    else request.mm_decoder_inputs.to_data(),
                    stream_conditioning=request.stream_conditioning,
                    conditioning=conditioning,
                    conditioning_fill=fill,
                    output_codes=list(request.output_codes),
                )
            )
            budget.take(request.request_id, n)

    def _admit(self, request: Request, n: int, computed: KVCacheBlocks, num_hit: int) -> None:
        self.kv.allocate_slots(request, n + self.num_lookahead_slots, computed)
        self.waiting.popleft()
        self.running.append(request)
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = num_hit
        if request.num_cached_tokens < 0:
            request.num_cached_tokens = num_hit

    def _on_scheduled(self, request: Request, num_new_tokens: int, num_spec: int) -> None:
        """Advance progress as if the step had run, every draft accepted (the async
        subclass adds placeholders)."""
        request.num_computed_tokens += num_new_tokens

    def _on_sampled(self, request: Request, num_spec: int) -> None:
        """A step's tokens arrived for `request`, which had `num_spec` draft slots in it
        (the async subclass drops that step's placeholders)."""

    # -- results -------------------------------------------------------------------------
    def update_from_output(
        self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> list[EngineCoreOutput]:
        """Append sampled tokens, apply stop rules, free finished requests."""
        outputs: list[EngineCoreOutput] = []
        index = runner_output.req_id_to_index
        hidden = _split_hidden_states(runner_output)
        for req_id in scheduler_output.num_scheduled_tokens:
            request = self.requests.get(req_id)
            if request is None or request.is_finished:
                continue  # ended (aborted) while the step ran: its results are dropped
            i = index[req_id]
            sampled = runner_output.sampled_token_ids[i]
            if not sampled:
                if hidden is not None:  # a prompt chunk: only its hidden states to report
                    outputs.append(
                        EngineCoreOutput(
                            request_id=req_id,
                            new_token_ids=[],
                            hidden_states=hidden[i],
                            hidden_start=runner_output.hidden_starts[i],
                        )
                    )
                continue
            logprobs = runner_output.logprobs[i] if runner_output.logprobs else None
            # Async: a request preempted while its token was in flight waits, yet may stop now.
            queue = self.running if request.status == RequestStatus.RUNNING else self.waiting
            num_spec = scheduler_output.scheduled_spec_tokens.get(req_id, 0)
            self._on_sampled(request, num_spec)
            if num_spec:
                self._on_verified(request, runner_output, i, num_spec, len(sampled) - 1)
            if runner_output.proposed_drafts is not None:
                request.num_proposed_drafts = runner_output.proposed_drafts[i]
            new_tokens = append_and_check_stop(request, sampled, self.max_model_len)
            codes = runner_output.sampled_codes[i] if runner_output.sampled_codes else None
            if codes:
                request.output_codes.append(codes)
            outputs.append(
                EngineCoreOutput(
                    request_id=req_id,
                    new_token_ids=new_tokens,
                    new_logprobs=logprobs[: len(new_tokens)] if logprobs else None,
                    finish_reason=request.status.finish_reason,
                    stop_reason=request.stop_reason,
                    num_cached_tokens=max(request.num_cached_tokens, 0),
                    hidden_states=None if hidden is None else hidden[i],
                    hidden_start=0 if hidden is None else runner_output.hidden_starts[i],
                    new_codes=[codes] if codes else None,
                    num_draft_tokens=request.num_draft_tokens,
                    num_accepted_tokens=request.num_accepted_tokens,
                )
            )
            if request.is_finished:
                queue.remove(request)
                self._release(request)
        return outputs

    def _on_verified(
        self,
        request: Request,
        runner_output: ModelRunnerOutput,
        index: int,
        num_spec: int,
        num_accepted: int,
    ) -> None:
        """Count the step's drafts, and take back the positions of the rejected ones (a
        request preempted meanwhile recomputes from scratch: nothing to take back)."""
        if request.status == RequestStatus.RUNNING:
            request.num_computed_tokens -= num_spec - num_accepted
        verified = runner_output.verified_drafts
        num_drafts = verified[index] if verified is not None else num_spec
        request.num_draft_tokens += num_drafts
        request.num_accepted_tokens += num_accepted
        self.spec_stats.record(num_drafts, num_accepted)


def _split_hidden_states(runner_output: ModelRunnerOutput) -> list[torch.Tensor] | None:
    """The step's hidden-state rows per request (runner order), when the runner sent them
    (always with `hidden_counts`: a rejected draft's row is not sent)."""
    if runner_output.hidden_states is None:
        return None
    rows = blob_to_tensor(runner_output.hidden_states)
    return list(torch.split(rows, runner_output.hidden_counts))
