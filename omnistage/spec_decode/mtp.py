"""`MtpProposer`: drafts from the checkpoint's own multi-token-prediction (MTP) layers.

The MTP module (`families/qwen3_next/model.py: MultiTokenPredictor`) at position `p` takes
the target's final hidden state `h_p` and the embedding of the token at `p + 1`,
and its logits predict the token at `p + 2`. Its attention layer has its own KV
cache tensors but the target's block tables and slots (same block size and
count), so the scheduler's allocation covers it: MTP keys at position `p` need
the token at `p + 1`, so the MTP holds one position fewer than a request's
tokens, and its draft passes write `k - 1` positions past the verified ones
(`SpeculativeConfig.num_lookahead_slots`).

After each target step, every scheduled row catches up on the positions the
target made real this step, `[RequestState.draft_num_computed,
num_computed_tokens)`, with the step's own `hidden` rows: a row's positions
start at its first flat token, and a row that verified drafts only counts its
accepted positions as computed, so only their hidden rows are used. The row's
last position gives the first draft; each further draft feeds the MTP's own
output hidden state and the previous draft one position on (with one MTP layer
and k > 1, as vLLM: every draft pass runs the first MTP layer). Those draft
positions are overwritten by the next catch-up. What the MTP holds is kept per
request, never per row. Requests whose inputs are more than token ids (prompt
embeddings, 3-D positions) get no drafts and are not followed.

A catch-up never starts before the step's first position (read from the step's
positions): prefix caching is off for these hybrid models, but were a request to
start past position 0, the MTP keys before it would be what the cached blocks hold.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from omnistage.models.base import CausalLM
from omnistage.spec_decode.greedy_drafts import extend_drafts
from omnistage.spec_decode.proposer import DraftHost, PassLayout


class MtpProposer:
    MTP_LAYER = 0
    """The MTP layer every pass runs (its cache is the one allocated)."""

    def __init__(self, model: CausalLM, kv_caches: list[torch.Tensor]) -> None:
        if getattr(model, "mtp", None) is None:
            raise ValueError("speculative_config.method: mtp needs a model with MTP layers")
        self.model = model
        """The target: its MTP module, token embeddings and lm_head."""
        self.mtp = model.mtp
        self.mtp.bind_kv_cache(kv_caches)

    @torch.inference_mode()
    def propose(
        self, runner: DraftHost, inputs: Any, wanted: dict[int, int], hidden: torch.Tensor
    ) -> dict[int, list[int]]:
        """Catch up on every row of the step from the target's `hidden` (one row per flat
        token of `inputs`); drafts (up to `wanted[row]`) for the rows in `wanted`."""
        batch = runner.batch
        firsts = np.cumsum([0, *inputs.row_counts[:-1]])  # each row's first flat token
        flat_positions = inputs.positions if inputs.positions.ndim == 1 else inputs.positions[0]
        fed_from = flat_positions[torch.from_numpy(firsts).to(flat_positions.device)].tolist()
        rows, starts, counts, hidden_rows = [], [], [], []
        for row, first, step_start in zip(inputs.rows, firsts, fed_from, strict=True):
            state = batch.states[row]
            # Positions before the step's first are the MTP's already (it follows every
            # step of a request); only the accepted ones of the step's are computed.
            start = max(state.draft_num_computed, step_start)
            end = state.num_computed_tokens
            if end > start and runner.drafts_allowed(state.req_id):
                rows.append(row)
                starts.append(start)
                counts.append(end - start)
                offset = first + start - step_start
                hidden_rows.append(np.arange(offset, offset + end - start))
                state.draft_num_computed = end
        if not rows:
            return {}
        rows_np, starts_np, counts_np = (
            np.array(v, dtype=np.int64) for v in (rows, starts, counts)
        )
        layout = runner.flat_layout(rows_np, starts_np, counts_np)
        # Position p pairs h_p with the token at p + 1 (known: p + 1 <= the newest token).
        ids = torch.from_numpy(batch.token_ids[layout.tok_rows, layout.positions + 1])
        index = torch.from_numpy(np.concatenate(hidden_rows)).to(hidden.device)
        out = self._forward(ids, hidden[index], layout)  # also for rows that do not draft
        drafting = [r for r in rows if wanted.get(r, 0) > 0]
        if not drafting:
            return {}
        last = {r: int(e) - 1 for r, e in zip(rows, layout.ends, strict=True)}
        out = out[torch.tensor([last[r] for r in drafting], device=out.device)]
        tokens = self.model.compute_logits(out).argmax(dim=-1)
        drafts = {r: [int(t)] for r, t in zip(drafting, tokens.tolist(), strict=True)}
        carried = [out]  # each pass continues from the MTP's own output of the last

        def step(ids: torch.Tensor, layout: PassLayout, keep: list[int]) -> torch.Tensor:
            previous = carried[0][torch.tensor(keep, device=carried[0].device)]
            carried[0] = self._forward(ids, previous, layout)
            return self.model.compute_logits(carried[0])

        next_position = {r: batch.states[r].draft_num_computed for r in drafting}
        return extend_drafts(runner, drafts, wanted, next_position, step)

    def _forward(self, ids: torch.Tensor, hidden: torch.Tensor, layout: PassLayout) -> torch.Tensor:
        device = hidden.device
        positions = torch.from_numpy(layout.positions).to(device)
        with layout.forward_context():
            return self.mtp(
                self.model.embed_input_ids(ids.to(device)), hidden, positions, self.MTP_LAYER
            )
