"""Mamba2's state-space scan, without the D skip: chunked (SSD) and recurrent forms.

    h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T,   y_t = h_t C_t

`ssd_chunk_scan` runs a run of tokens of one request in the chunked (SSD) form of
transformers' `mamba2_chunk_scan`; `recurrent_ssm_step` advances many requests by
one token each. Pure tensor functions; the mixer that runs them is
`families/mamba2/mixer.py`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def segment_sum(a: torch.Tensor) -> torch.Tensor:
    """[..., T] -> [..., T, T]: out[i, j] = a[j+1] + ... + a[i] for i >= j, -inf above the
    diagonal (masked cumulative sums, stable where differences of cumsums are not)."""
    length = a.shape[-1]
    a = a[..., None].expand(*a.shape, length)
    strict = torch.tril(torch.ones(length, length, dtype=torch.bool, device=a.device), -1)
    sums = torch.cumsum(a.masked_fill(~strict, 0), dim=-2)
    lower = torch.tril(torch.ones(length, length, dtype=torch.bool, device=a.device))
    return sums.masked_fill(~lower, float("-inf"))


def ssd_chunk_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    initial_state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked (SSD) scan of one sequence, without the D skip.

    x [L, H, P], dt [L, H] (discretised), A [H], B and C [L, H, N], initial_state
    [H, P, N] -> y [L, H, P] and the final state [H, P, N]. Within a chunk the output is
    an attention-like masked product; across chunks the states are carried by the
    chunks' total decays. Padded positions have dt = 0 (no decay, no input)."""
    length, heads, head_dim = x.shape
    pad = (-length) % chunk_size
    xdt = F.pad(x * dt[..., None], (0, 0, 0, 0, 0, pad))
    a = F.pad(dt * A, (0, 0, 0, pad))
    B = F.pad(B, (0, 0, 0, 0, 0, pad))
    C = F.pad(C, (0, 0, 0, 0, 0, pad))
    chunks = (length + pad) // chunk_size
    # c: chunk, l/s: position in chunk, h: head, p: head_dim, n: state.
    xdt = xdt.view(chunks, chunk_size, heads, head_dim)
    B = B.view(chunks, chunk_size, heads, -1)
    C = C.view(chunks, chunk_size, heads, -1)
    a = a.view(chunks, chunk_size, heads).permute(2, 0, 1)  # [h, c, l]
    a_cum = torch.cumsum(a, dim=-1)

    # 1. Inside each chunk: y_l = sum_{s <= l} (C_l . B_s) decay(s -> l) xdt_s.
    decay = torch.exp(segment_sum(a))  # [h, c, l, s]
    scores = torch.einsum("clhn,cshn->clsh", C, B) * decay.permute(1, 2, 3, 0)
    y_diag = torch.einsum("clsh,cshp->clhp", scores, xdt)

    # 2. Each chunk's own contribution to the state at its end.
    decay_to_end = torch.exp(a_cum[:, :, -1:] - a_cum)  # [h, c, l]
    B_decayed = B * decay_to_end.permute(1, 2, 0)[..., None]
    chunk_states = torch.einsum("clhn,clhp->chpn", B_decayed, xdt)

    # 3. States at chunk boundaries: carry the initial state and every chunk's own state
    # through the total decays of the chunks after it.
    states = torch.cat([initial_state[None].to(chunk_states.dtype), chunk_states])
    chunk_decay = torch.exp(segment_sum(F.pad(a_cum[:, :, -1], (1, 0))))  # [h, target, source]
    boundary = torch.einsum("hts,shpn->thpn", chunk_decay, states)
    starts, final = boundary[:-1], boundary[-1]

    # 4. Each chunk's start state seen by its positions.
    y_off = (
        torch.einsum("clhn,chpn->clhp", C, starts) * torch.exp(a_cum).permute(1, 2, 0)[..., None]
    )
    y = (y_diag + y_off).reshape(chunks * chunk_size, heads, head_dim)[:length]
    return y, final


def recurrent_ssm_step(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
) -> torch.Tensor:
    """One token per request: state [R, H, P, N], x [R, H, P], dt [R, H], B, C [R, H, N]
    -> the state after the token."""
    decay = torch.exp(dt * A)[..., None, None]
    return state * decay + (dt[..., None] * x)[..., None] * B[:, :, None, :]
