"""Fault injection for tests and chaos drills: the `OMNISTAGE_FAULTS` environment variable.

Unset (the default), nothing here runs. Set to a JSON mapping of stage names to faults,
every stage core built while it is set (stage processes inherit it; a restarted stage
reads it again) wraps its model call, so a fault strikes where a real one would — in the
middle of a step, after the batch was scheduled::

    OMNISTAGE_FAULTS='{"talker": {"raise_for": "boom-"},
                       "vocoder": {"sleep_for": "slow-", "sleep_s": 0.2}}'

- `raise_for`: the model call raises `InjectedFault` (a `RuntimeError`) when a request
  whose id contains this text is in it;
- `sleep_for`, `sleep_s`: the model call first sleeps `sleep_s` seconds when such a
  request is in it (a slow stage);
- `stall_for`: a mapping of markers to seconds: the first model call with a request
  whose id contains the marker sleeps that long, once per request (one long step, or one
  that never ends in time: a stuck stage).

The model call is, per stage kind: `ar` the executor's `execute_model` / `submit` (the
scheduled batch), `generation` the model's `generate` (the batch of work items),
`diffusion` the engine's denoiser call (`_predict`, the batch of running requests).
Never set it in production: a client choosing its request id would choose a fault.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

FAULTS_ENV = "OMNISTAGE_FAULTS"


class InjectedFault(RuntimeError):
    """The exception a `raise_for` fault raises inside a stage's model call."""


@dataclass(frozen=True)
class StageFaults:
    """The faults of one stage (see the module docstring)."""

    raise_for: str | None = None
    sleep_for: str | None = None
    sleep_s: float = 0.0
    stall_for: dict[str, float] = field(default_factory=dict)
    stalled: set[str] = field(default_factory=set, compare=False)
    """The request ids that stalled already (each stalls once)."""

    def strike(self, stage: str, request_ids: Iterable[str]) -> None:
        """Sleep and/or raise, as the faults say, for a model call over `request_ids`."""
        ids = list(request_ids)
        if self.sleep_for and any(self.sleep_for in rid for rid in ids):
            time.sleep(self.sleep_s)
        for marker, seconds in self.stall_for.items():
            hit = [rid for rid in ids if marker in rid and rid not in self.stalled]
            if hit:
                self.stalled.update(hit)
                time.sleep(seconds)
        if self.raise_for:
            hit = [rid for rid in ids if self.raise_for in rid]
            if hit:
                raise InjectedFault(f"injected fault in stage {stage!r} for request {hit[0]!r}")


def stage_faults(stage: str) -> StageFaults | None:
    """The faults `OMNISTAGE_FAULTS` sets for `stage`, or None (a ValueError when it is not a
    JSON mapping of stage names to fault mappings)."""
    raw = os.environ.get(FAULTS_ENV)
    if not raw:
        return None
    try:
        table = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{FAULTS_ENV}: not JSON: {exc}") from None
    if not isinstance(table, dict) or stage not in table:
        return None
    try:
        return StageFaults(**table[stage])
    except TypeError as exc:
        raise ValueError(f"{FAULTS_ENV}: stage {stage!r}: {exc}") from None


def install_faults(core: Any) -> None:
    """Wrap the model call of a stage core (an `ARStageCore`, `GenerationStageCore` or
    `DiffusionStageCore`) with the faults `OMNISTAGE_FAULTS` sets for it, if any."""
    faults = stage_faults(core.name)
    if faults is None:
        return
    kind = core.spec.kind
    if kind == "ar":
        executor = core.engine.core.executor
        for method in ("execute_model", "submit"):
            _wrap(executor, method, faults, core.name, lambda out: _scheduled_ids(out))
    elif kind == "generation":
        batch_ids: dict[int, str] = {}
        step = core.step

        def step_noting_items() -> Any:  # generate() sees items only: map them to requests
            batch_ids.clear()
            batch_ids.update({id(w.item): w.request_id for w in core.queue})
            return step()

        core.step = step_noting_items
        _wrap(core.model, "generate", faults, core.name, lambda items: _item_ids(items, batch_ids))
    elif kind == "diffusion":
        _wrap(
            core.engine, "_predict", faults, core.name, lambda batch: [r.request_id for r in batch]
        )


def _wrap(
    owner: Any, method: str, faults: StageFaults, stage: str, ids_of: Callable[[Any], list[str]]
) -> None:
    original = getattr(owner, method)

    def faulty(batch: Any, *args: Any, **kwargs: Any) -> Any:
        faults.strike(stage, ids_of(batch))
        return original(batch, *args, **kwargs)

    setattr(owner, method, faulty)


def _scheduled_ids(scheduler_output: Any) -> list[str]:
    new = [r.req_id for r in scheduler_output.scheduled_new_reqs]
    return new + list(scheduler_output.scheduled_cached_reqs.req_ids)


def _item_ids(items: list[Any], batch_ids: dict[int, str]) -> list[str]:
    return [batch_ids.get(id(item), "") for item in items]
