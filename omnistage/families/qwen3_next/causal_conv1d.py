"""Depthwise causal conv1d over per-request conv states (the gated delta-net's input conv).

A request's conv state is its last K - 1 inputs (`[K - 1, C]`), so a step continues
the convolution exactly where the previous step left it. Two forms: a run of tokens
of one request (`causal_conv1d`) and one token of many requests (`causal_conv1d_step`).
Neither applies the activation.
"""

from __future__ import annotations

import torch


def causal_conv1d(
    x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv of T tokens of one sequence (no activation).

    x: [T, C]; state: [K - 1, C], the inputs before x; weight: [C, K]. Returns the outputs
    [T, C] and the inputs the next step needs, `cat(state, x)` ([K - 1 + T, C]): the state
    after token j is its rows j + 1 .. j + K - 1."""
    padded = torch.cat([state, x])
    length, kernel = x.shape[0], weight.shape[1]
    # K shifted multiply-adds: faster on CPU than a depthwise F.conv1d at these sizes.
    out = padded[:length] * weight[:, 0]
    for j in range(1, kernel):
        out.addcmul_(padded[j : j + length], weight[:, j])
    return out, padded


def causal_conv1d_step(
    x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of each of B sequences: x [B, C], state [B, K - 1, C]. Returns the outputs
    [B, C] (no activation) and the new states."""
    window = torch.cat([state, x.unsqueeze(1)], dim=1)  # [B, K, C]
    return (window * weight.t()).sum(1), window[:, 1:]
