"""The gated delta rule: the recurrence of Qwen3-Next's and Qwen3.5's linear attention.

Per token t and value head h, with a key/query head shared by `Hv / Hk` value heads:

    S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T      S: [dk, dv]
    o_t = S_t^T q_t

(q and k L2-normalised, q scaled by dk^-1/2). Two forms of the rule, equal up to
rounding:
- `chunked_gated_delta_rule` for a run of tokens of one request (a prompt or a
  chunk of it): the UT transform condenses the updates inside a chunk of
  `chunk_size` tokens into a few matmuls, then a scan over chunks carries S;
- `recurrent_gated_delta_step` for one token of many requests at once (decode),
  and, token by token (`recurrent_gated_delta_rule`), for speculative-verification
  rows, whose state after every token is kept.

Pure tensor functions; the layer that runs them is `families/qwen3_next/gated_delta_net.py`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

DEFAULT_CHUNK_SIZE = 64


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim (the FLA / transformers convention)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def chunked_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule over T tokens of one sequence, chunk by chunk.

    q, k: [T, H, dk] (normalised, q scaled, expanded to the value heads); v: [T, H, dv];
    g (log decay, <= 0), beta: [T, H]; state: [H, dk, dv], the state before the first token.
    Returns the outputs [T, H, dv] and the state after the last token.

    Inside a chunk with cumulative log decay G_i = g_1 + ... + g_i, the state written by
    token j is read by token i >= j decayed by exp(G_i - G_j). The corrections
    u_i = beta_i (v_i - exp(g_i) S_{i-1}^T k_i) then solve the unit lower-triangular system
    (I + A) u = beta v - beta exp(G) k S_0, A_ij = beta_i exp(G_i - G_j) k_i . k_j (j < i).
    """
    length, heads, dk = k.shape
    dv = v.shape[-1]
    chunks = -(-length // chunk_size)
    pad = chunks * chunk_size - length

    def split(x: torch.Tensor) -> torch.Tensor:
        # [T, H, ...] -> [H, chunks, C, ...]; padded tokens have k = v = beta = g = 0 and
        # so neither read nor change the state.
        x = F.pad(x, (0, 0) * (x.dim() - 1) + (0, pad))
        x = x.reshape(chunks, chunk_size, heads, *x.shape[2:])
        return x.movedim(2, 0)

    q, k, v, g, beta = (split(x) for x in (q, k, v, g, beta))
    cum = g.cumsum(-1)  # [H, n, C]
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).tril()
    # Masked before exp: above the diagonal G_i - G_j > 0 could overflow.
    decay = torch.where(causal, cum.unsqueeze(-1) - cum.unsqueeze(-2), float("-inf")).exp()
    k_beta = k * beta.unsqueeze(-1)
    system = (k_beta @ k.transpose(-1, -2)) * decay  # diagonal ignored: unit triangular
    values = torch.linalg.solve_triangular(
        system, v * beta.unsqueeze(-1), upper=False, unitriangular=True
    )
    state_reads = torch.linalg.solve_triangular(
        system, k_beta * cum.exp().unsqueeze(-1), upper=False, unitriangular=True
    )
    intra = (q @ k.transpose(-1, -2)) * decay  # [H, n, C, C], j <= i
    q_decayed = q * cum.exp().unsqueeze(-1)
    k_decayed = k * (cum[..., -1:] - cum).exp().unsqueeze(-1)
    chunk_decay = cum[..., -1].exp()[..., None, None]  # [H, n, 1, 1]
    out = torch.empty(heads, chunks, chunk_size, dv, dtype=v.dtype, device=v.device)
    for c in range(chunks):
        u = values[:, c] - state_reads[:, c] @ state
        out[:, c] = q_decayed[:, c] @ state + intra[:, c] @ u
        state = state * chunk_decay[:, c] + k_decayed[:, c].transpose(-1, -2) @ u
    out = out.reshape(heads, chunks * chunk_size, dv)[:, :length]
    return out.transpose(0, 1), state


def recurrent_gated_delta_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of each of B sequences: q, k [B, H, dk]; v [B, H, dv]; g, beta [B, H];
    state [B, H, dk, dv]. Returns the outputs [B, H, dv] and the new states."""
    state = state * g.exp()[..., None, None]
    remembered = (k.unsqueeze(-2) @ state).squeeze(-2)  # S^T k: [B, H, dv]
    delta = (v - remembered) * beta.unsqueeze(-1)
    state = state + k.unsqueeze(-1) * delta.unsqueeze(-2)
    return (q.unsqueeze(-2) @ state).squeeze(-2), state


def recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule over T tokens of one sequence, token by token (shapes as in
    `chunked_gated_delta_rule`). Returns the outputs [T, H, dv] and the state after each
    token [T, H, dk, dv]."""
    outs, states = [], []
    for t in range(k.shape[0]):
        o, state = recurrent_gated_delta_step(q[t], k[t], v[t], g[t], beta[t], state)
        outs.append(o)
        states.append(state)
    return torch.stack(outs), torch.stack(states)
