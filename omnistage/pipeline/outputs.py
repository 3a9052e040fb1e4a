"""What a pipeline request returns: per final stage, its text, tokens or data (audio,
images)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from omnistage.pipeline.row_buffer import RowBuffer


class _Record:
    """One stage's outputs for one request, append-only: tokens, text pieces, data rows.
    Only the orchestrator's thread appends; snapshots read prefixes of it."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.text_pieces: list[str] = []
        self.rows = RowBuffer()
        self._joined: tuple[int, str] = (0, "")
        """The text of the first n pieces, as last read (each read joins only what is new)."""

    def text(self, num_pieces: int) -> str:
        done, text = self._joined
        if num_pieces == done:
            return text
        if num_pieces < done:  # an older snapshot: join its prefix afresh
            return "".join(self.text_pieces[:num_pieces])
        text += "".join(self.text_pieces[done:num_pieces])
        self._joined = (num_pieces, text)
        return text


@dataclass
class StageResult:
    """Everything one stage produced for a request so far.

    The orchestrator appends with `add`; what callers get are `snapshot`s, which
    share the appended data and see only what was there when they were taken. Both
    cost O(1) (plus the new pieces for `add`), so a stream of n bytes costs O(n) to
    collect however many updates it makes; reading `text` or `token_ids` builds them
    (O(length)), reading `data` is a view (O(1))."""

    stage: str
    modality: str | None
    sample_rate: int | None = None
    finished: bool = False
    finish_reason: str | None = None
    num_prompt_tokens: int | None = None
    """An ar stage's prompt length in the model (media placeholders expanded), once known."""
    _record: _Record = field(default_factory=_Record, repr=False)
    _num_tokens: int = 0
    _num_text_pieces: int = 0
    _num_rows: int = 0

    def add(
        self, new_token_ids: list[int], new_text: str = "", data: torch.Tensor | None = None
    ) -> None:
        """Append a step's output: its new tokens, new text and data rows (the orchestrator)."""
        record = self._record
        if new_token_ids:
            record.tokens += new_token_ids
            self._num_tokens = len(record.tokens)
        if new_text:
            record.text_pieces.append(new_text)
            self._num_text_pieces = len(record.text_pieces)
        if data is not None:
            record.rows.append(data)
            self._num_rows = record.rows.length

    def snapshot(self) -> StageResult:
        """This result as it is now; later `add`s do not change it."""
        return copy.copy(self)

    @property
    def text(self) -> str:
        return self._record.text(self._num_text_pieces)

    @property
    def token_ids(self) -> list[int]:
        return self._record.tokens[: self._num_tokens]

    @property
    def data(self) -> torch.Tensor | None:
        """The output rows so far (e.g. the waveform), concatenated; a view shared with
        other snapshots: copy it before changing it in place."""
        return self._record.rows.view(self._num_rows)

    @property
    def bytes_copied(self) -> int:
        """Bytes of data rows copied to collect this result so far (amortized O(rows))."""
        return self._record.rows.bytes_copied


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
    unavailable: bool = False
    """It failed because a stage it needs died, hung or is restarting (the server answers
    503: try again later); `error` names the stage."""
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
        """The waveform (float32 numpy) when the request asked for audio; empty when the
        audio stage finished without a sample (its talker ended at its first frame)."""
        result = self._first("audio")
        if result is None:
            return None
        if result.data is None:
            return np.zeros(0, dtype=np.float32) if result.finished else None
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
