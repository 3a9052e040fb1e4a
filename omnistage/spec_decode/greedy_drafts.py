"""`extend_drafts`: the greedy decode passes a draft model or MTP layer runs after its
first draft (one pass per further draft, over the rows still short of theirs).

Pass `j` feeds each such row its newest draft at position `next_position[row] + j - 1`
(the position right after the last real token, then one further per pass); the keys
written there lie past what the target has verified, and the next catch-up overwrites
them. `step(ids, layout, keep)` runs the drafter on that pass and returns its logits
(`keep`: indices of the rows still drafting among the previous pass's, for drafters
that carry a hidden state from pass to pass).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from omnistage.spec_decode.proposer import DraftHost, PassLayout


def extend_drafts(
    runner: DraftHost,
    drafts: dict[int, list[int]],
    wanted: dict[int, int],
    next_position: dict[int, int],
    step: Callable[[torch.Tensor, PassLayout, list[int]], torch.Tensor],
) -> dict[int, list[int]]:
    """Grow each row's drafts (its first one given) greedily up to `wanted[row]`."""
    active = list(drafts)
    for j in range(1, max((wanted[r] for r in active), default=0)):
        keep = [i for i, r in enumerate(active) if wanted[r] > j]
        active = [active[i] for i in keep]
        positions = np.array([next_position[r] + j - 1 for r in active], dtype=np.int64)
        layout = runner.flat_layout(
            np.array(active, dtype=np.int64), positions, np.ones(len(active), np.int64)
        )
        ids = torch.tensor([drafts[r][-1] for r in active])
        for r, t in zip(active, step(ids, layout, keep).argmax(dim=-1).tolist(), strict=True):
            drafts[r].append(int(t))
    return drafts
