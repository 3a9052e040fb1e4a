"""`StepIsolation`: after a failed step, which request to blame, found by running alone.

A step's model call that raises cannot say which of its requests caused it (one bad
payload, a prompt embedding of the wrong width, a fault in a model's own code for one
input). The engine core then preempts every running request — its runner state is
unknown — and, when the failed step held more than one, makes them suspects: until
each has run a step alone and sampled a token in it (or ended), the scheduler runs
only the first suspect, alone. A suspect whose step fails alone is the one to blame;
it fails, and the others go on where they were (recomputed from their confirmed
tokens, which the stateless sampler continues exactly: DESIGN.md invariant 2).

Requests that were not in the failed step wait meanwhile; each suspect costs one
recomputation of its context plus one decode step.
"""

from __future__ import annotations

from collections.abc import Container, Iterable

from omnistage.core.engine_core_output import EngineCoreOutput


class StepFailed(RuntimeError):
    """A step's model call raised and `blamed` ran in it alone: they are the ones to fail.

    Raised by `EngineCore.step` with the runner's exception as `__cause__`; the engine is
    consistent again (everything that was running is preempted) and can step on."""

    def __init__(self, blamed: list[str], cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.blamed = blamed


class StepIsolation:
    """The suspects of failed steps, in the order they ran; the first runs alone."""

    def __init__(self) -> None:
        self.suspects: list[str] = []
        self.num_failed_steps = 0
        """Steps whose model call raised (for counters and tests)."""

    def suspect(self, request_ids: Iterable[str]) -> None:
        """Run each of `request_ids` alone before it joins a batch again. Called only when
        no suspect is left: while there is one, every step runs one request."""
        self.suspects = list(request_ids)

    def focus(self, live: Container[str]) -> str | None:
        """The suspect to run alone now (None: batch as usual), forgetting ended ones."""
        if not self.suspects:  # every step asks: no work when nothing failed
            return None
        self.suspects = [r for r in self.suspects if r in live]
        return self.suspects[0] if self.suspects else None

    def admits(self, request_id: str) -> bool:
        """May `request_id` be scheduled this step (call after `focus`)?"""
        return not self.suspects or request_id == self.suspects[0]

    def cleared(self, outputs: Iterable[EngineCoreOutput]) -> None:
        """A suspect that sampled a token (or ended) alone is innocent."""
        if not self.suspects:
            return
        for out in outputs:
            if out.request_id in self.suspects and (out.new_token_ids or out.finished):
                self.suspects.remove(out.request_id)
