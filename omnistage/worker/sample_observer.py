"""Sample observers: the public seam for watching what the model runner samples.

Whoever wants the logits a model produced at each sampling step, or what was
sampled from them (parity tests against a reference implementation, tools),
installs an observer on the runner instead of wrapping its private methods:

    seen: list[torch.Tensor] = []
    observer = runner.add_sample_observer(lambda event: seen.append(event.logits))
    ...                                   # steps run; one event per sampling step
    runner.remove_sample_observer(observer)

or, for a block, `with runner.observing_samples(observer): ...`.

After each step that samples, the runner's sampling dispatch calls every observer
with one `SampleEvent`, in order of installation, on the thread that runs the
runner. The runner is reachable in the engine's own process with the inline and
thread executors (`engine.core.executor.runner`); a runner in a worker process
(the process executor) cannot be observed from the engine's process, so tests
that observe run with one of the other two.

Cost: while no observer is installed, one check of an empty list per step and
nothing else (no copy, no allocation). While one is, the raw logits are copied
before the logits processors change them in place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SampleEvent:
    """One sampling step, as the runner's sampling dispatch saw it."""

    req_ids: list[str]
    """The request of each sampled position, in the order of `logits`' rows: one position
    per sampling request, or, for a request verifying drafts, `1 + len(drafts)`
    consecutive positions (after its newest token, then after each draft)."""

    logits: torch.Tensor
    """[S, V]: the model's logits at those positions, before any logits processor or
    stage transition. The observer's own copy: keep it as it is."""

    token_ids: torch.Tensor
    """[S]: the token sampled at each position (under speculation: the target's token at
    every position, including those after a rejected draft, which are not emitted)."""

    codes: torch.Tensor | None = None
    """[S, C]: models that sample codes with each token (`num_token_codes`): those codes."""


SampleObserver = Callable[[SampleEvent], None]
"""Called once per sampling step with what was sampled; its return value is ignored and an
exception it raises fails the step."""
