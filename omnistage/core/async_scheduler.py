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

    def _on_scheduled(self, request: Request, num_new_tokens: int) -> None:
        super()._on_scheduled(request, num_new_tokens)
        if request.num_computed_tokens >= request.num_tokens + request.num_output_placeholders:
            request.num_output_placeholders += 1  # this step samples a token for it

    def _on_sampled(self, request: Request, num_tokens: int) -> None:
        # A request preempted while its token was in flight had its placeholders reset.
        request.num_output_placeholders = max(0, request.num_output_placeholders - num_tokens)
