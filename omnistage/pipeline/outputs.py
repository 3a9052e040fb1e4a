"""What a pipeline request returns: per final stage, its text, tokens or data (audio,
images)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass
class StageResult:
    """Everything one stage produced for a request so far."""

    stage: str
    modality: str | None
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    chunks: list[torch.Tensor] = field(default_factory=list)
    """Pieces of a generation stage's output, in order (stream chunks, or one)."""
    sample_rate: int | None = None
    finished: bool = False
    finish_reason: str | None = None

    @property
    def data(self) -> torch.Tensor | None:
        if not self.chunks:
            return None
        if len(self.chunks) > 1:
            self.chunks[:] = [torch.cat(self.chunks)]
        return self.chunks[0]


@dataclass
class OmniRequestOutput:
    """A pipeline request's outputs: final when `finished`, else a streaming update.

    `outputs` holds the results of the request's final stages by stage name. An
    update also says which stage it came from and what is new (`new_text`,
    `new_token_ids`, `new_data`)."""

    request_id: str
    outputs: dict[str, StageResult]
    finished: bool = False
    error: str | None = None
    """Why the request failed (a stage's error, an input timeout, a crashed stage)."""
    aborted: bool = False
    stage: str | None = None
    new_text: str = ""
    new_token_ids: list[int] = field(default_factory=list)
    new_data: torch.Tensor | None = None
    progress: tuple[int, int] | None = None
    """A diffusion stage's `(steps done, steps in all)`, on its progress updates."""

    def _first(self, modality: str) -> StageResult | None:
        return next((r for r in self.outputs.values() if r.modality == modality), None)

    @property
    def text(self) -> str | None:
        result = self._first("text")
        return None if result is None else result.text

    @property
    def token_ids(self) -> list[int] | None:
        result = self._first("text") or self._first("tokens")
        return None if result is None else result.token_ids

    @property
    def audio(self) -> np.ndarray | None:
        """The waveform (float32 numpy) when the request asked for audio."""
        result = self._first("audio")
        if result is None or result.data is None:
            return None
        return result.data.to(torch.float32).numpy()

    @property
    def sample_rate(self) -> int | None:
        result = self._first("audio")
        return None if result is None else result.sample_rate

    @property
    def image_array(self) -> np.ndarray | None:
        """The image (`[H, W, 3]` uint8 numpy) when the request asked for one."""
        result = self._first("image")
        if result is None or result.data is None:
            return None
        return result.data.numpy()

    @property
    def image(self) -> Any:
        """The image as a `PIL.Image.Image` when the request asked for one."""
        array = self.image_array
        if array is None:
            return None
        from PIL import Image

        return Image.fromarray(array, "RGB")
