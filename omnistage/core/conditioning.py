"""`ConditioningFeed`: the scheduler's side of stream-conditioned requests.

A stream-conditioned request takes one conditioning row per position after its
prompt, added to that position's input embedding, streamed in from another
stage while it generates (`Request.conditioning`); positions whose row has not
come yet wait (`Request.conditioned_positions_limit`). The feed records rows
as they arrive and ships each to the runner once: a runner that (re)learns the
request (new, or after a preemption) gets every row so far, a running one the
rows new since its last step, and the fill row (of every position after the
last row) once, when the stream has ended.
"""

from __future__ import annotations

import torch

from omnistage.core.request import Request
from omnistage.core.tensor_blob import TensorBlob, tensor_to_blob


class ConditioningFeed:
    def __init__(self) -> None:
        self._fill_unsent: set[str] = set()
        """Requests whose fill row the runner has not been sent yet."""

    def add(
        self, request: Request, rows: torch.Tensor, finished: bool, fill: torch.Tensor | None
    ) -> None:
        """More rows for `request`; with `finished`, `fill` is the row of every later
        position (None: later positions get none)."""
        if rows.shape[0]:
            request.conditioning.append(rows)
        if finished and not request.conditioning_finished:
            request.conditioning_finished = True
            request.conditioning_fill = fill
            self._fill_unsent.add(request.request_id)

    def discard(self, request_id: str) -> None:
        """The request ended: forget it."""
        self._fill_unsent.discard(request_id)

    @property
    def num_unsent_fills(self) -> int:
        """Requests whose fill row waits to be sent (zero once they all ended: a leak check)."""
        return len(self._fill_unsent)

    def for_new(self, request: Request) -> tuple[TensorBlob | None, TensorBlob | None]:
        """(every row so far, the fill row once the stream ended) for a runner that
        (re)learns the request."""
        request.num_conditioning_sent = 0
        rows = self._unsent_rows(request)
        fill = self._take_fill(request) if request.conditioning_finished else None
        return rows, fill

    def collect(
        self,
        request: Request,
        new_rows: dict[str, TensorBlob],
        new_fill: dict[str, TensorBlob],
    ) -> None:
        """Into the step's messages: the rows and the fill row of a scheduled running
        request that its runner has not had yet."""
        if request.stream_conditioning and (rows := self._unsent_rows(request)) is not None:
            new_rows[request.request_id] = rows
        if request.request_id in self._fill_unsent and (
            (fill := self._take_fill(request)) is not None
        ):
            new_fill[request.request_id] = fill

    def _take_fill(self, request: Request) -> TensorBlob | None:
        self._fill_unsent.discard(request.request_id)
        fill = request.conditioning_fill
        return None if fill is None else tensor_to_blob(fill)

    @staticmethod
    def _unsent_rows(request: Request) -> TensorBlob | None:
        if request.num_conditioning_sent == request.num_conditioning_rows:
            return None
        rows = torch.cat(request.conditioning)
        request.conditioning[:] = [rows]  # pieces compacted: the row count stays cheap
        blob = tensor_to_blob(rows[request.num_conditioning_sent :])
        request.num_conditioning_sent = rows.shape[0]
        return blob
