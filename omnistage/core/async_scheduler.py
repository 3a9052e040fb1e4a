"""`AsyncScheduler`: the scheduler for asynchronous scheduling (vLLM's is a 68-line subclass too).

With async scheduling, step N+1 is scheduled while step N runs, so a decode
request's next input token is not known yet. It is counted, never stored:
when a step will sample a token for a request, `num_output_placeholders`
goes up by one; when the token arrives it goes down and the real token is
appended (DESIGN.md invariant 1: placeholders are scheduler accounting only).
The runner, which produced the token, writes it into its own history before
anything of step N+1 reads it.

Requests that finish at step N while already scheduled at N+1 are released at
N's update; N+1's results for them are dropped by `update_from_output`.

With speculation, step N+1 offers a request the most draft slots (step N's
drafts are not known yet) and counts one placeholder per slot plus one; when
step N's tokens arrive its placeholders go and its rejected positions are
taken back. The runner never reads these counts: it verifies the drafts it
holds at the positions it knows (DESIGN.md invariant 5).
"""

from __future__ import annotations

from omnistage.core.request import Request
from omnistage.core.scheduler import Scheduler


class AsyncScheduler(Scheduler):
    def _tokens_to_compute(self, request: Request) -> int:
        # The in-flight token already reaches max_tokens: nothing more to schedule.
        if request.num_output_tokens + request.num_output_placeholders >= request.max_tokens:
            return 0
        return super()._tokens_to_compute(request)

    def _num_draft_slots(self, request: Request) -> int:
        # The drafts of the step in flight are not known yet: offer the most; the runner
        # verifies as many as it has.
        return self._draft_limit(request)

    def _on_scheduled(self, request: Request, num_new_tokens: int, num_spec: int) -> None:
        super()._on_scheduled(request, num_new_tokens, num_spec)
        if request.num_computed_tokens >= request.num_tokens + request.num_output_placeholders:
            # This step samples for it: one token, and one per draft slot at most.
            request.num_output_placeholders += 1 + num_spec

    def _on_sampled(self, request: Request, num_spec: int) -> None:
        # A request preempted while its token was in flight had its placeholders reset.
        request.num_output_placeholders = max(0, request.num_output_placeholders - 1 - num_spec)
