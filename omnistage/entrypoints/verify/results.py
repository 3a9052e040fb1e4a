"""What one configuration's run of the workload produced, reduced to what is compared.

Per request: each stage's `StageTrace` (its token ids, finish reason and a digest of
its output data: audio, image) and a digest of every payload a stage received (by edge
and chunk); per run: which requests were aborted and what was still held at the end
(`leaks`: counter name -> value, empty when nothing leaked).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any


@dataclasses.dataclass
class StageTrace:
    """One stage's output for one request."""

    token_ids: list[int] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    data_digest: str | None = None
    """sha256 of the stage's output data (audio samples, image pixels); None: no data."""
    error: str | None = None
    floats: Any = None
    """Float output data (a waveform decoded from continuous latents), kept so that two
    runs compare within the payloads' float tolerance (`payloads.TOLERANCE`) when their
    digests differ; None for any other data (compared by digest only)."""


@dataclasses.dataclass
class RunResult:
    """One configuration's run."""

    config: str
    traces: dict[str, dict[str, StageTrace]] = dataclasses.field(default_factory=dict)
    """Request key -> stage name -> its trace (requests aborted on purpose left out)."""
    payloads: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    """Request key -> `<edge>#<chunk>` -> the payload its consumer received
    (`payloads.keep`)."""
    aborted: set[str] = dataclasses.field(default_factory=set)
    leaks: dict[str, float] = dataclasses.field(default_factory=dict)
    stages: list[str] = dataclasses.field(default_factory=list)
    """The stages in pipeline order (the order a first difference is looked for in)."""


def digest(data: Any) -> str:
    """sha256 (first 16 hex digits) of a tensor's, array's or bytes' exact contents."""
    if hasattr(data, "detach"):  # a torch tensor
        data = data.detach().cpu().contiguous().numpy()
    if hasattr(data, "tobytes"):
        data = data.tobytes()
    return hashlib.sha256(bytes(data)).hexdigest()[:16]
