"""`StepInputBuilder`: the flat inputs of one step, from the persistent batch.

Given the `SchedulerOutput`, it lays the scheduled tokens of every batch row out
one row after another (worker/flat_layout.py): token ids, positions, cache slots
and attention metadata, the rows that sample and where their logits are. Rows
given draft slots get their drafts written past their history and fed after
their newest token. Rotary positions are 1-D token positions unless a scheduled
request has 3-D ones (multimodal prompts, GLM-Image's generated grid): the
builder keeps the set of such requests, so a step of plain text never looks.
Likewise for prompts whose tokens carry a modality (`token_modality`): the step's
flat per-token codes go into its attention metadata (the forward context), for a
chunk of a prompt the codes of exactly its positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from omnistage.core.sched_output import SchedulerOutput
from omnistage.layers.attention import AttentionMetadata
from omnistage.layers.attention_backend import TORCH_ATTENTION, AttentionBackend
from omnistage.worker.flat_layout import FlatLayout, build_flat_layout
from omnistage.worker.input_batch import InputBatch, RequestState
from omnistage.worker.recurrent import RecurrentSlots


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    attn: AttentionMetadata
    rows: list[int]
    """Batch rows scheduled this step, in flat order."""
    row_counts: list[int]
    """Tokens of each of those rows this step."""
    sample_rows: list[int]
    """Rows that sample a token this step (their prompt is fully computed)."""
    logits_indices: torch.Tensor
    """Flat index of the last token of each sampling row (of its last 1 + len(drafts)
    tokens when it verifies drafts)."""
    drafts: dict[int, list[int]]
    """Rows that verify drafts this step: the drafts, fed after their newest token."""
    sample_outputs_before: list[int]
    """Per sampling row: how many outputs precede the (first) token it samples, from the
    step's positions (computed + fed - drafts - prompt), not from its history's length;
    sampling checks the history against it (sample/metadata.py)."""


class StepInputBuilder:
    """Builds each step's `StepInputs` over one runner's batch and block tables."""

    def __init__(
        self,
        batch: InputBatch,
        block_size: int,
        device: torch.device,
        recurrent: RecurrentSlots | None,
        attention_backend: AttentionBackend = TORCH_ATTENTION,
    ) -> None:
        self.batch = batch
        self.attention_backend = attention_backend
        """The platform's attention backend, carried by every pass's attention metadata."""
        self.block_size = block_size
        self.device = device
        self.recurrent = recurrent
        """Models with recurrent layers: the requests' state slots (a verifying row keeps a
        state per position)."""
        self.mrope: set[str] = set()
        """Requests with 3-D rotary positions of their prompt or outputs (an empty set: every
        step keeps 1-D positions)."""
        self.modal: set[str] = set()
        """Requests whose prompt tokens carry a modality (`token_modality`)."""

    def track(self, state: RequestState) -> None:
        """Note a request the runner just took on (one with 3-D positions or per-token
        modalities is followed)."""
        mm = state.mm_decoder_inputs
        if mm is not None and (mm.mrope_positions is not None or mm.decode_positions is not None):
            self.mrope.add(state.req_id)
        if mm is not None and mm.token_modality is not None:
            self.modal.add(state.req_id)

    def forget(self, req_id: str) -> None:
        self.mrope.discard(req_id)
        self.modal.discard(req_id)

    def build(self, so: SchedulerOutput) -> StepInputs:
        """Flat token ids, positions, cache slots and attention metadata of the step."""
        batch = self.batch
        live = batch.states[: batch.num_rows]
        counts = np.array([so.num_scheduled_tokens.get(s.req_id, 0) for s in live], dtype=np.int64)
        computed = np.array([s.num_computed_tokens for s in live], dtype=np.int64)
        drafts = self._place_drafts(so, counts, computed) if so.scheduled_spec_tokens else {}
        rows = np.flatnonzero(counts)
        n, start = counts[rows], computed[rows]
        layout = self.flat_layout(rows, start, n)
        if self.recurrent is not None:  # verifying rows keep a state per position
            layout.attn.recurrent = self.recurrent.metadata(
                [batch.states[r].req_id for r in rows],
                n.tolist(),
                start.tolist(),
                [1 + len(drafts[r]) if r in drafts else 0 for r in rows.tolist()],
                self.device,
            )
        sampling = start + n >= batch.num_tokens[rows]
        sample_rows = rows[sampling].tolist()
        outputs_before = [
            int(first) - len(drafts.get(r, ())) - len(batch.states[r].prompt_token_ids)
            for r, first in zip(sample_rows, (start + n)[sampling].tolist(), strict=True)
        ]
        ends = layout.ends[sampling]
        if drafts:
            widths = [1 + len(drafts.get(r, ())) for r in sample_rows]
            logits_indices = np.concatenate(
                [np.arange(e - w, e) for e, w in zip(ends, widths, strict=True)]
            )
        else:
            logits_indices = ends - 1
        pos = layout.positions
        if self.modal:
            layout.attn.token_modality = self._token_modality(rows, layout.first, n, start)
        return StepInputs(
            input_ids=torch.from_numpy(batch.token_ids[layout.tok_rows, pos]).to(self.device),
            positions=torch.from_numpy(
                self._rotary_positions(rows, layout.first, n, start, pos) if self.mrope else pos
            ).to(self.device),
            attn=layout.attn,
            rows=rows.tolist(),
            row_counts=n.tolist(),
            sample_rows=sample_rows,
            logits_indices=torch.from_numpy(logits_indices).to(self.device),
            drafts=drafts,
            sample_outputs_before=outputs_before,
        )

    def flat_layout(self, rows: np.ndarray, start: np.ndarray, n: np.ndarray) -> FlatLayout:
        """The layout of a pass over `n[i]` tokens of row `rows[i]` from position `start[i]`
        (the step's, or a draft model's / MTP layer's pass over the same blocks)."""
        layout = build_flat_layout(
            self.batch.block_table, self.block_size, self.device, rows, start, n
        )
        layout.attn.backend = self.attention_backend
        return layout

    def _place_drafts(
        self, so: SchedulerOutput, counts: np.ndarray, computed: np.ndarray
    ) -> dict[int, list[int]]:
        """Rows given draft slots: feed up to that many of the drafts they hold, written
        past their history in the token rows (never into it); `counts` shrinks to what
        is fed. Returns the drafts each such row verifies."""
        placed: dict[int, list[int]] = {}
        for req_id, slots in so.scheduled_spec_tokens.items():
            row = self.batch.req_id_to_row[req_id]
            state = self.batch.states[row]
            num_tokens = int(self.batch.num_tokens[row])
            if computed[row] != num_tokens - 1 or computed[row] < len(state.prompt_token_ids):
                drafts = []  # not decoding yet (async: its prompt's last token is in this step)
            else:
                drafts = state.draft_token_ids[:slots]
            counts[row] = min(counts[row], num_tokens - computed[row]) + len(drafts)
            if drafts:
                self.batch.token_ids[row, num_tokens : num_tokens + len(drafts)] = drafts
                placed[row] = drafts
        return placed

    def _token_modality(
        self, rows: np.ndarray, first: np.ndarray, counts: np.ndarray, starts: np.ndarray
    ) -> torch.Tensor | None:
        """[T] int64: the modality of each token of the step (a prompt token `i` of a request
        in `modal` takes `token_modality[i]`, every other token 0, text); None when every
        scheduled token is text."""
        out = None
        for req_id in self.modal:
            row = self.batch.req_id_to_row[req_id]
            i = int(np.searchsorted(rows, row))
            if i == len(rows) or rows[i] != row:
                continue  # not scheduled this step
            state = self.batch.states[row]
            s, length = int(starts[i]), len(state.prompt_token_ids)
            kinds = state.mm_decoder_inputs.token_modality[s : min(s + int(counts[i]), length)]
            if not len(kinds) or not bool(kinds.any()):
                continue  # past its prompt, or a chunk of text only
            if out is None:
                out = torch.zeros(int(counts.sum()), dtype=torch.int64)
            f = int(first[i])
            out[f : f + len(kinds)] = kinds
        return None if out is None else out.to(self.device)

    def _rotary_positions(
        self,
        rows: np.ndarray,
        first: np.ndarray,
        counts: np.ndarray,
        starts: np.ndarray,
        pos: np.ndarray,
    ) -> np.ndarray:
        """Rotary positions of the step's tokens when some request has 3-D positions: a
        prompt token `i` of such a request takes `mrope_positions[:, i]`, a generated token
        `j` `decode_positions[:, j]` (GLM-Image) or else its sequence index plus
        `rope_delta`, every other token its sequence index. [3, T] when a scheduled token
        takes 3-D positions, else [T] (Qwen decode steps stay 1-D)."""
        out, parts = pos, []
        for req_id in self.mrope:
            row = self.batch.req_id_to_row[req_id]
            i = int(np.searchsorted(rows, row))
            if i == len(rows) or rows[i] != row:
                continue  # not scheduled this step
            state = self.batch.states[row]
            mm = state.mm_decoder_inputs
            f, n, s = int(first[i]), int(counts[i]), int(starts[i])
            length = len(state.prompt_token_ids)
            if s < length and mm.mrope_positions is not None:
                parts.append((f, mm.mrope_positions[:, s : min(s + n, length)]))
            if s + n <= length:
                continue
            out_at = f + max(length - s, 0)  # flat index of the first generated token
            if mm.decode_positions is not None:
                parts.append((out_at, mm.output_positions(max(s - length, 0), f + n - out_at)))
            elif mm.rope_delta:
                if out is pos:
                    out = pos.copy()
                out[out_at : f + n] += mm.rope_delta
        if not parts:
            return out
        out = np.repeat(out[None], 3, axis=0)
        for at, positions in parts:
            out[:, at : at + positions.shape[1]] = positions.numpy()
        return out
