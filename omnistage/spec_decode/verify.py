"""Verifying drafts: the rejection sampler of omnistage.

Every proposer here (n-gram lookup, a draft model's argmax, MTP's argmax)
proposes single tokens, not distributions: the draft distribution `q` is a
point mass on the draft `d`. For such drafts the rejection sampler of
speculative sampling (accept `d` with probability min(1, p(d) / q(d)) = p(d);
on rejection sample from the residual max(0, p - q), i.e. `p` without `d`)
is the same as: sample the target's own token `t ~ p` at that position, accept
the draft when `t == d`, else emit `t` and stop. That is what `accepted_counts`
does, with `t` drawn by the ordinary sampling pipeline (logits processors,
the model's own sampler, the default sampler) from the history the position
would have, and from the request's random stream keyed by output position.

So the tokens a request gets are the tokens it would get without
speculation, token for token, greedy or random: exact for greedy, the target
distribution for random sampling, and seeded requests reproduce.
"""

from __future__ import annotations

import torch


def accepted_counts(target: torch.Tensor, drafts: list[list[int]]) -> torch.Tensor:
    """[R] int64 on `target`'s device: per row, how many leading drafts equal the target's
    tokens at their positions.

    `target` [S] holds the target's token at every sampled position, rows in order, row
    `i` taking `1 + len(drafts[i])` entries (after the last draft: the bonus token)."""
    widths = torch.tensor([len(d) for d in drafts], dtype=torch.int64)
    kmax = int(widths.max()) if len(drafts) else 0
    if kmax == 0:
        return torch.zeros(len(drafts), dtype=torch.int64, device=target.device)
    starts = torch.cumsum(widths + 1, 0) - (widths + 1)
    steps = torch.arange(kmax)
    index = (starts.unsqueeze(1) + steps).clamp(max=target.shape[0] - 1)
    valid = steps < widths.unsqueeze(1)
    padded = torch.full((len(drafts), kmax), -1, dtype=torch.int64)
    for i, d in enumerate(drafts):
        padded[i, : len(d)] = torch.tensor(d, dtype=torch.int64)
    device = target.device
    match = (target[index.to(device)] == padded.to(device)) & valid.to(device)
    return match.long().cumprod(dim=1).sum(dim=1)
