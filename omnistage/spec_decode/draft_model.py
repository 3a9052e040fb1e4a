"""`DraftModelProposer`: drafts from a smaller model of the same tokenizer.

The draft model has its own KV cache tensors but the target's block tables
and slots: same block size and block count, so the scheduler's allocation
(with `num_lookahead_slots` extra slots per request) covers both. After each
target step it catches up on the positions the target has made real
(prompt chunks as the target computes them; for a sampled request, its
accepted tokens and the new one), then runs greedy decode passes for the
drafts, writing their keys ahead; those positions are overwritten by the next
catch-up, which starts from the last real position the draft model holds
(`RequestState.draft_num_computed`), kept per request, never per row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from omnistage.models.base import CausalLM
from omnistage.spec_decode.greedy_drafts import extend_drafts
from omnistage.spec_decode.proposer import DraftHost, PassLayout


class DraftModelProposer:
    def __init__(self, model: CausalLM, kv_caches: list[torch.Tensor]) -> None:
        self.model = model
        self.model.bind_kv_cache(kv_caches)

    @torch.inference_mode()
    def propose(
        self, runner: DraftHost, inputs: Any, wanted: dict[int, int], hidden: Any = None
    ) -> dict[int, list[int]]:
        """Catch up on every row of the step; drafts for the rows in `wanted` (the target's
        `hidden` states are not used)."""
        batch = runner.batch
        rows, starts, counts = [], [], []
        for row in inputs.rows:
            state = batch.states[row]
            # A sampled row: every real token; a prompt chunk: what the target computed.
            end = int(batch.num_tokens[row]) if row in wanted else state.num_computed_tokens
            if end > state.draft_num_computed:
                rows.append(row)
                starts.append(state.draft_num_computed)
                counts.append(end - state.draft_num_computed)
                state.draft_num_computed = end
        if not rows:
            return {}
        rows_np, starts_np, counts_np = (
            np.array(v, dtype=np.int64) for v in (rows, starts, counts)
        )
        layout = runner.flat_layout(rows_np, starts_np, counts_np)
        ids = torch.from_numpy(batch.token_ids[layout.tok_rows, layout.positions])
        hidden = self._forward(ids, layout)  # prompt chunks too: no gaps in the draft's cache
        drafting = [r for r in rows if wanted.get(r, 0) > 0]
        if not drafting:
            return {}
        last = {r: int(e) - 1 for r, e in zip(rows, layout.ends, strict=True)}
        picks = torch.tensor([last[r] for r in drafting])
        tokens = self.model.compute_logits(hidden[picks]).argmax(dim=-1)
        drafts = {r: [int(t)] for r, t in zip(drafting, tokens.tolist(), strict=True)}
        return extend_drafts(
            runner,
            drafts,
            wanted,
            {r: int(batch.num_tokens[r]) for r in drafting},
            lambda ids, layout, keep: self.model.compute_logits(self._forward(ids, layout)),
        )

    def _forward(self, ids: torch.Tensor, layout: PassLayout) -> torch.Tensor:
        device = next(self.model.parameters()).device
        positions = torch.from_numpy(layout.positions).to(device)
        with layout.forward_context():
            return self.model(ids.to(device), positions)
