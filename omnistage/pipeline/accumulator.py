"""Producer side of an edge: collect a request's per-step outputs, cut them into payloads.

The stage feeds `add_step` only with step results its scheduler *accepted*
(tokens the request really produced, and the hidden states of positions it
really computed), so under async scheduling the payloads are byte-identical
to sync (DESIGN.md invariant 6): a step scheduled after the request had in
fact finished is dropped before it gets here.

Hidden states are collected per position: a request preempted and recomputed
reports positions it already reported, and those rows are not appended twice.

Each key is collected one way for all the outgoing edges (`collected_modes`, checked when
the deploy loads): the step keys (`STEP_KEYS`: ids, hidden states, codes) are CONCAT,
appended row by row; the rest are REPLACE, set by the stage with `set_value` (the latest
value wins) and sent whole with every chunk.

Per outgoing edge the accumulator produces either one payload when the request
finishes (`transfer: payload`) or chunks (`transfer: stream`): the first after
`first_chunk_size` rows of the processor's stream key, then every
`chunk_size` rows (growing `chunk_growth`-fold per chunk up to `max_chunk_size`, when the
edge asks for it), and a last one (possibly empty) marked `meta.finished`.
Chunk boundaries depend only on row counts, never on step timing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from omnistage.core.edge_processor import (
    CODES_KEY,
    LATENTS_KEY,
    Accumulate,
    EdgeProcessor,
    collected_modes,
)
from omnistage.core.payload import Payload
from omnistage.pipeline.deploy import EdgeSpec

HIDDEN_KEY = "hidden_states.output"


@dataclass
class _EdgeCursor:
    edge: EdgeSpec
    processor: EdgeProcessor
    sent: dict[str, int] = field(default_factory=dict)
    """Rows of each CONCAT key already sent in earlier chunks."""
    next_chunk: int = 0


class RequestAccumulator:
    """Everything one request has produced so far for the stage's outgoing edges."""

    def __init__(
        self,
        request_id: str,
        stage: str,
        prompt_token_ids: list[int],
        edges: list[tuple[EdgeSpec, EdgeProcessor]],
        float_dtype: torch.dtype = torch.float64,
    ) -> None:
        self.request_id = request_id
        self.stage = stage
        self.float_dtype = float_dtype
        """The dtype of `LATENTS_KEY` rows: the producer's (its rows are its model's values)."""
        self.modes = collected_modes(
            (f"{e.src}->{e.dst} ({e.processor})", p.accumulate) for e, p in edges
        )
        self.rows: dict[str, list[torch.Tensor]] = {
            k: [] for k, m in self.modes.items() if m is Accumulate.CONCAT
        }
        self.counts: dict[str, int] = dict.fromkeys(self.rows, 0)
        self.ints: dict[str, list] = {}
        """Integer rows of a step key not yet in `rows` (`_append_ints`)."""
        self.latest: dict[str, torch.Tensor] = {}
        if "ids.prompt" in self.modes:
            self.latest["ids.prompt"] = torch.tensor(prompt_token_ids, dtype=torch.int64)
        self.cursors = [_EdgeCursor(e, p) for e, p in edges]

    @property
    def wants_hidden_states(self) -> bool:
        return HIDDEN_KEY in self.modes

    def set_value(self, key: str, value: torch.Tensor) -> bool:
        """Set a REPLACE key that only the stage knows (e.g. the prompt's image grids); a later
        set replaces it, and a key no outgoing edge collects is ignored. Returns whether it
        was kept."""
        mode = self.modes.get(key)
        if mode is None:
            return False
        if mode is not Accumulate.REPLACE:
            raise ValueError(f"payload key {key!r} is collected by {mode.value}, not set")
        self.latest[key] = value
        return True

    def add_step(
        self,
        new_token_ids: list[int],
        hidden: torch.Tensor | None,
        hidden_start: int,
        new_codes: list[list[int | float]] | None = None,
    ) -> None:
        """One accepted step of the request: its new tokens (with their codes, for models
        that sample codes with each token) and computed positions."""
        if new_token_ids and "ids.output" in self.modes:
            self._append_ints("ids.output", new_token_ids)
        if new_token_ids and CODES_KEY in self.modes:
            if not new_codes or len(new_codes) != len(new_token_ids):
                raise RuntimeError(
                    f"request {self.request_id!r}: {CODES_KEY} needs a model that samples codes "
                    "with each token"
                )
            frames = [[t, *c] for t, c in zip(new_token_ids, new_codes, strict=True)]
            self._append_ints(CODES_KEY, frames)
        if new_token_ids and LATENTS_KEY in self.modes:
            if not new_codes or len(new_codes) != len(new_token_ids):
                raise RuntimeError(f"request {self.request_id!r}: {LATENTS_KEY} without float rows")
            rows = torch.tensor(new_codes, dtype=torch.float64)  # exact, then the model's dtype
            self._append(LATENTS_KEY, rows.to(self.float_dtype))
        if hidden is not None and HIDDEN_KEY in self.modes:
            have = self.counts[HIDDEN_KEY]
            if hidden_start > have:
                raise RuntimeError(
                    f"request {self.request_id!r}: hidden states jump from position {have} "
                    f"to {hidden_start}"
                )
            fresh = hidden[have - hidden_start :]
            if fresh.shape[0]:
                self._append(HIDDEN_KEY, fresh.detach().to("cpu").clone())

    def _append(self, key: str, rows: torch.Tensor) -> None:
        # Only step keys get here, and those are CONCAT (`collected_modes` refuses others).
        self._flush_ints(key)
        self.rows[key].append(rows)
        self.counts[key] += rows.shape[0]

    def _append_ints(self, key: str, rows: list) -> None:
        """Integer rows (token ids, code frames) stay Python lists until a payload takes
        them: one int64 tensor per cut instead of one per step."""
        self.ints.setdefault(key, []).extend(rows)
        self.counts[key] += len(rows)

    def _flush_ints(self, key: str) -> None:
        pending = self.ints.pop(key, None)
        if pending:
            self.rows[key].append(torch.tensor(pending, dtype=torch.int64))

    # -- payloads ---------------------------------------------------------------------------------
    def ready_chunks(self) -> list[tuple[EdgeSpec, int, Payload, bool]]:
        """Stream chunks that are complete now: (edge, chunk index, payload, last=False)."""
        ready = []
        for cursor in self.cursors:
            if cursor.edge.transfer != "stream":
                continue
            while True:
                size = self._next_chunk_size(cursor)
                key = cursor.processor.stream_key
                if self.counts[key] - cursor.sent.get(key, 0) < size:
                    break
                ready.append(self._cut(cursor, size, last=False))
        return ready

    def final_payloads(self) -> list[tuple[EdgeSpec, int, Payload, bool]]:
        """At finish: whole payloads, or the remaining stream chunks and the last one."""
        out = self.ready_chunks()
        for cursor in self.cursors:
            out.append(self._cut(cursor, None, last=True))
        return out

    def _next_chunk_size(self, cursor: _EdgeCursor) -> int:
        edge, n = cursor.edge, cursor.next_chunk
        if n == 0:
            return edge.first_chunk_size
        size = edge.chunk_size * edge.chunk_growth ** (n - 1)
        return size if edge.max_chunk_size is None else min(size, edge.max_chunk_size)

    def _cut(
        self, cursor: _EdgeCursor, size: int | None, last: bool
    ) -> tuple[EdgeSpec, int, Payload, bool]:
        payload: Payload = {}
        for key, mode in cursor.processor.accumulate.items():
            if mode is Accumulate.REPLACE:
                if key in self.latest:
                    payload[key] = self.latest[key]
                continue
            start = cursor.sent.get(key, 0)
            stop = self.counts[key]
            if size is not None and key == cursor.processor.stream_key:
                stop = start + size
            payload[key] = self._slice(key, start, stop)
            cursor.sent[key] = stop
        index = cursor.next_chunk
        cursor.next_chunk += 1
        payload.update(
            {
                "meta.request_id": self.request_id,
                "meta.source_stage": self.stage,
                "meta.chunk_index": index,
                "meta.finished": last,
            }
        )
        return cursor.edge, index, payload, last

    def _slice(self, key: str, start: int, stop: int) -> torch.Tensor:
        self._flush_ints(key)
        parts = self.rows[key]
        if len(parts) > 1:  # compact once: later slices are views of one tensor
            parts[:] = [torch.cat(parts)]
        if not parts:
            return torch.empty(0, dtype=torch.int64)
        return parts[0][start:stop].contiguous()
