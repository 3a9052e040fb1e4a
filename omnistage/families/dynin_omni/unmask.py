"""Masked-diffusion decoding as LLaDA and Dynin-Omni do it: a region of mask tokens is
filled block by block (semi-autoregressively), each block in a fixed number of steps; each
step runs the whole sequence, predicts every masked position greedily and keeps the
`k` most confident predictions (low-confidence remasking), `k` spreading the block's
masks evenly over its steps (`transfer_counts`).

This is the reference's `generate` (LLaDA's `generate.py`, temperature 0,
`remasking="low_confidence"`) and its `t2s_generate_mmu_like` (the same loop over the
speech region, predictions restricted to speech units and the end-of-audio token).
Greedy: no noise, so the ids depend on the weights and the prompt only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Logits = Callable[[torch.Tensor], torch.Tensor]
"""`[1, seq]` ids -> `[1, seq, vocab]` logits."""


def transfer_counts(num_masked: int, steps: int) -> list[int]:
    """How many masks each of `steps` steps unmasks: `num_masked` spread evenly, the
    remainder on the first steps (the reference's `get_num_transfer_tokens`)."""
    base, rest = divmod(num_masked, steps)
    return [base + (1 if i < rest else 0) for i in range(steps)]


def fill_masks(
    logits_fn: Logits,
    ids: torch.Tensor,
    start: int,
    length: int,
    *,
    mask_id: int,
    block_length: int,
    steps: int,
    candidates: torch.Tensor | None = None,
) -> torch.Tensor:
    """`ids` (1-D) with its masks in `[start, start + length)` filled; `candidates`: the ids a
    position may take (None: the whole vocabulary)."""
    x = ids.clone()
    num_blocks = max(1, length // block_length)
    per_block = max(1, steps // num_blocks)
    for b in range(num_blocks):
        lo, hi = start + b * block_length, min(start + (b + 1) * block_length, start + length)
        counts = transfer_counts(int((x[lo:hi] == mask_id).sum()), per_block)
        for k in counts:
            masked = x == mask_id
            if k == 0 or not bool(masked.any()):
                continue
            logits = logits_fn(x[None])[0]
            if candidates is not None:
                logits = logits[:, candidates]
            best = logits.argmax(dim=-1)
            probs = torch.softmax(logits.to(torch.float64), dim=-1)
            conf = probs.gather(-1, best[:, None])[:, 0]
            if candidates is not None:
                best = candidates[best]
            conf[hi:] = float("-inf")
            conf = torch.where(masked, conf, torch.full_like(conf, float("-inf")))
            chosen = torch.topk(conf, k=k).indices
            x[chosen] = best[chosen]
    return x
