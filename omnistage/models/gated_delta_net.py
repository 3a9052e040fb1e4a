"""Gated delta-net: the linear-attention token mixer of Qwen3-Next and Qwen3.5.

Per token t and value head h, with a key/query head shared by `Hv / Hk` value heads:

    S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T      S: [dk, dv]
    o_t = S_t^T q_t

(q and k L2-normalised, q scaled by dk^-1/2). The inputs q, k, v come from a
causal depthwise conv1d (kernel K, SiLU) over the projected tokens, so each
request carries two states between steps: the last K-1 conv inputs and S.

Two forms of the rule, equal up to rounding:
- `chunked_gated_delta_rule` for a run of tokens of one request (a prompt or a
  chunk of it): the UT transform condenses the updates inside a chunk of
  `chunk_size` tokens into a few matmuls, then a scan over chunks carries S;
- `recurrent_gated_delta_step` for one token of many requests at once (decode),
  and, token by token, for speculative-verification rows, whose state after
  every token is saved into the layer's scratch tensors.

`GatedDeltaNet` is the layer on the hot path: it reads the step's
`RecurrentMetadata` from the forward context, gathers the states of the
scheduled requests by `state_slots` (zeros where `has_initial_state` is
False), runs decodes together and prefills one request at a time, and writes
the states back. State layout per slot: conv `[K - 1, conv_dim]`, recurrent
`[Hv, dk, dv]`, in the model's dtype; the arithmetic runs in at least float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.layers.forward_context import get_forward_context
from omnistage.layers.linear import Linear, load_shard

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


@dataclass
class _StepPlan:
    """How the step's requests are run: decodes together, the rest one by one."""

    decode_reqs: torch.Tensor | None
    """[D] int64: requests (metadata order) with one token and no speculation."""
    decode_tokens: torch.Tensor | None
    """[D] int64: their flat token index."""
    all_decode: bool
    runs: list[tuple[int, int, int, int]]
    """(request, first token, tokens, spec_len) of every other request."""

    @classmethod
    def of(cls, meta: Any, device: torch.device) -> _StepPlan:
        decodes, tokens, runs = [], [], []
        for r, (start, n, spec) in enumerate(
            zip(meta.query_start_loc[:-1], meta.query_lens, meta.spec_lens, strict=True)
        ):
            if n == 1 and spec == 0:
                decodes.append(r)
                tokens.append(start)
            elif n > 0:
                runs.append((r, start, n, spec))
        if not decodes:
            return cls(None, None, False, runs)
        return cls(
            decode_reqs=torch.tensor(decodes, dtype=torch.long, device=device),
            decode_tokens=torch.tensor(tokens, dtype=torch.long, device=device),
            all_decode=not runs,
            runs=runs,
        )


class GatedDeltaNet(nn.Module):
    """The linear-attention mixer of one layer: x [T, hidden] -> out_proj(...) + residual.

    One fused input projection, rows `[q, k, v, z, b, a]` (q, k: Hk * dk each; v, z:
    Hv * dv each; b, a: Hv each), loaded from Qwen3.5's separate `in_proj_qkv/z/b/a` or
    from Qwen3-Next's per-key-head interleaved `in_proj_qkvz` / `in_proj_ba`."""

    def __init__(self, config: Any, dtype: torch.dtype) -> None:
        super().__init__()
        self.num_k_heads = config.linear_num_key_heads
        self.num_v_heads = config.linear_num_value_heads
        self.head_k_dim = config.linear_key_head_dim
        self.head_v_dim = config.linear_value_head_dim
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(
                f"linear_num_value_heads: {self.num_v_heads} is not a multiple of "
                f"linear_num_key_heads {self.num_k_heads}"
            )
        self.key_dim = self.num_k_heads * self.head_k_dim
        self.value_dim = self.num_v_heads * self.head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.kernel_size = config.linear_conv_kernel_dim
        self.eps = config.rms_norm_eps
        self.chunk_size = DEFAULT_CHUNK_SIZE
        hidden = config.hidden_size
        self.in_proj = Linear(
            hidden, self.conv_dim + self.value_dim + 2 * self.num_v_heads, False, dtype
        )
        self.conv_weight = nn.Parameter(
            torch.empty(self.conv_dim, self.kernel_size, dtype=dtype), requires_grad=False
        )
        self.dt_bias = nn.Parameter(torch.empty(self.num_v_heads, dtype=dtype), requires_grad=False)
        self.A_log = nn.Parameter(torch.empty(self.num_v_heads, dtype=dtype), requires_grad=False)
        self.norm_weight = nn.Parameter(
            torch.ones(self.head_v_dim, dtype=dtype), requires_grad=False
        )
        self.out_proj = Linear(self.value_dim, hidden, False, dtype)
        self.state: Any = None
        """The layer's `RecurrentLayerState` (bound by the model)."""

    # -- state ----------------------------------------------------------------------------------
    def state_shapes(self) -> tuple[tuple[int, ...], ...]:
        """Per-slot shapes of the conv state and the recurrent state."""
        return (
            (self.kernel_size - 1, self.conv_dim),
            (self.num_v_heads, self.head_k_dim, self.head_v_dim),
        )

    # -- forward --------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        meta = get_forward_context().recurrent
        if meta is None or self.state is None:
            raise RuntimeError("gated delta-net layer run without recurrent state metadata")
        compute = torch.promote_types(x.dtype, torch.float32)
        proj = self.in_proj(x).to(compute)
        mixed, z, b, a = proj.split(
            [self.conv_dim, self.value_dim, self.num_v_heads, self.num_v_heads], dim=-1
        )
        plan = _StepPlan.of(meta, x.device)
        # The scheduled requests' states, zeros where a request starts at position 0
        # (whatever its slot held before); updated in place below, then written back.
        conv_state, ssm_state = self.state.tensors
        slots, fresh = meta.state_slots, ~meta.has_initial_state
        conv = conv_state.index_select(0, slots).to(compute).masked_fill_(fresh[:, None, None], 0)
        ssm = ssm_state.index_select(0, slots).to(compute)
        ssm.masked_fill_(fresh[:, None, None, None], 0)

        conv_out, spec_conv = self._conv(mixed, conv, plan)
        q, k, v = conv_out.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        core, spec_ssm = self._rule(*self._rule_inputs(q, k, v, a, b), ssm, plan)

        conv_state.index_copy_(0, slots, conv.to(conv_state.dtype))
        ssm_state.index_copy_(0, slots, ssm.to(ssm_state.dtype))
        if spec_conv:
            self._save_scratch(slots, spec_conv, spec_ssm)

        # Gated RMSNorm per value head, then the output projection.
        core = core * torch.rsqrt(core.pow(2).mean(-1, keepdim=True) + self.eps)
        gate = F.silu(z.view(-1, self.num_v_heads, self.head_v_dim))
        core = (core * self.norm_weight.to(compute) * gate).to(x.dtype)
        return self.out_proj.add(core.reshape(-1, self.value_dim), residual)

    def _conv(
        self, mixed: torch.Tensor, conv: torch.Tensor, plan: _StepPlan
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """conv1d + SiLU of the step's tokens, updating `conv` ([R, K - 1, C]) in place.
        Also returns, per speculative request, its conv state after each of its tokens."""
        out = torch.empty_like(mixed)
        spec: dict[int, torch.Tensor] = {}
        if plan.decode_reqs is not None:
            reqs, toks = plan.decode_reqs, plan.decode_tokens
            tokens_in = mixed if plan.all_decode else mixed.index_select(0, toks)
            step_out, new = causal_conv1d_step(
                tokens_in, conv.index_select(0, reqs), self._weight(mixed)
            )
            out.index_copy_(0, toks, step_out)
            conv.index_copy_(0, reqs, new)
        for r, s, n, spec_len in plan.runs:
            out[s : s + n], padded = causal_conv1d(mixed[s : s + n], conv[r], self._weight(mixed))
            conv[r] = padded[n:]
            if spec_len:
                windows = padded[1:].unfold(0, self.kernel_size - 1, 1)  # [n, C, K - 1]
                spec[r] = windows[:spec_len].transpose(1, 2)
        return F.silu(out), spec

    def _weight(self, like: torch.Tensor) -> torch.Tensor:
        return self.conv_weight.to(like.dtype)

    def _rule(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        ssm: torch.Tensor,
        plan: _StepPlan,
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """The delta rule over the step's tokens, updating `ssm` ([R, Hv, dk, dv]) in place:
        decodes in one batched step, prefills chunked, speculative rows token by token (also
        returning their state after each token)."""
        core = torch.empty_like(v)
        spec: dict[int, torch.Tensor] = {}
        if plan.decode_reqs is not None:
            reqs, toks = plan.decode_reqs, plan.decode_tokens
            inputs = (q, k, v, g, beta)
            if not plan.all_decode:
                inputs = tuple(t.index_select(0, toks) for t in inputs)
            out, new = recurrent_gated_delta_step(*inputs, ssm.index_select(0, reqs))
            core.index_copy_(0, toks, out)
            ssm.index_copy_(0, reqs, new)
        for r, s, n, spec_len in plan.runs:
            span = slice(s, s + n)
            inputs = (q[span], k[span], v[span], g[span], beta[span])
            if spec_len:
                core[span], states = recurrent_gated_delta_rule(*inputs, ssm[r])
                ssm[r] = states[-1]
                spec[r] = states[:spec_len]
            else:
                core[span], ssm[r] = chunked_gated_delta_rule(*inputs, ssm[r], self.chunk_size)
        return core, spec

    def _rule_inputs(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """Heads split, q and k normalised (q scaled) and expanded to the value heads;
        the log decay g = -exp(A_log) softplus(a + dt_bias) and beta = sigmoid(b)."""
        tokens = q.shape[0]
        q = l2_normalize(q.view(tokens, self.num_k_heads, self.head_k_dim)) * self.head_k_dim**-0.5
        k = l2_normalize(k.view(tokens, self.num_k_heads, self.head_k_dim))
        group = self.num_v_heads // self.num_k_heads
        if group > 1:
            q, k = q.repeat_interleave(group, dim=1), k.repeat_interleave(group, dim=1)
        v = v.view(tokens, self.num_v_heads, self.head_v_dim)
        g = -self.A_log.to(a.dtype).exp() * F.softplus(a + self.dt_bias.to(a.dtype))
        return q, k, v, g, b.sigmoid()

    def _save_scratch(
        self,
        slots: torch.Tensor,
        conv: dict[int, torch.Tensor],
        ssm: dict[int, torch.Tensor],
    ) -> None:
        """scratch[slot, j] = the state after token j of each speculative row."""
        if self.state.scratch is None:
            raise RuntimeError("speculative rows need recurrent scratch state")
        conv_scratch, ssm_scratch = self.state.scratch
        for r, states in conv.items():
            slot = slots[r : r + 1]  # a device index: no host sync
            conv_scratch[slot, : states.shape[0]] = states.to(conv_scratch.dtype).unsqueeze(0)
            ssm_scratch[slot, : states.shape[0]] = ssm[r].to(ssm_scratch.dtype).unsqueeze(0)

    # -- weights --------------------------------------------------------------------------------
    def load(self, name: str, tensor: torch.Tensor) -> list[str]:
        """Load the HF tensor `name` (relative to the layer's `linear_attn.`); returns the keys
        it set (`param` or `param@row_offset`), [] for a name this layer does not have."""
        tensor = tensor.to(self.in_proj.weight.dtype)
        z_at = self.conv_dim
        b_at = z_at + self.value_dim
        a_at = b_at + self.num_v_heads
        offsets = {
            "in_proj_qkv.weight": 0,
            "in_proj_z.weight": z_at,
            "in_proj_b.weight": b_at,
            "in_proj_a.weight": a_at,
        }
        if name in offsets:
            load_shard(self.in_proj.weight, tensor, offsets[name])
            return [f"in_proj.weight@{offsets[name]}"]
        if name == "in_proj_qkvz.weight":
            return self._load_interleaved(tensor, (0, self.key_dim, 2 * self.key_dim, z_at))
        if name == "in_proj_ba.weight":
            return self._load_interleaved(tensor, (b_at, a_at))
        if name == "conv1d.weight":
            self._copy(self.conv_weight, tensor.reshape(self.conv_dim, -1), name)
            return ["conv_weight"]
        direct = {
            "dt_bias": self.dt_bias,
            "A_log": self.A_log,
            "norm.weight": self.norm_weight,
            "out_proj.weight": self.out_proj.weight,
        }
        if name in direct:
            self._copy(direct[name], tensor, name)
            return [name.replace("norm.weight", "norm_weight")]
        return []

    def _load_interleaved(self, tensor: torch.Tensor, offsets: tuple[int, ...]) -> list[str]:
        """Qwen3-Next's projections: per key head, its q, k rows then the v, z (or b, a)
        rows of its value heads. Split into the fused layout's blocks at `offsets`."""
        group = self.num_v_heads // self.num_k_heads
        if len(offsets) == 4:
            sizes = [
                self.head_k_dim,
                self.head_k_dim,
                group * self.head_v_dim,
                group * self.head_v_dim,
            ]
        else:
            sizes = [group, group]
        per_head = tensor.reshape(self.num_k_heads, sum(sizes), -1)
        for part, offset in zip(per_head.split(sizes, dim=1), offsets, strict=True):
            load_shard(self.in_proj.weight, part.reshape(-1, tensor.shape[-1]), offset)
        return [f"in_proj.weight@{o}" for o in offsets]

    def expected_keys(self, interleaved: bool) -> list[str]:
        """Keys `load` sets for a complete layer (`interleaved`: Qwen3-Next's names)."""
        z_at = self.conv_dim
        b_at, a_at = z_at + self.value_dim, z_at + self.value_dim + self.num_v_heads
        offsets = (
            (0, self.key_dim, 2 * self.key_dim, z_at, b_at, a_at)
            if interleaved
            else (
                0,
                z_at,
                b_at,
                a_at,
            )
        )
        rest = ["conv_weight", "dt_bias", "A_log", "norm_weight", "out_proj.weight"]
        return [f"in_proj.weight@{o}" for o in offsets] + rest

    @staticmethod
    def _copy(param: torch.Tensor, tensor: torch.Tensor, name: str) -> None:
        if tensor.shape != param.shape:
            raise ValueError(
                f"linear_attn.{name}: shape {tuple(tensor.shape)}, expected {tuple(param.shape)}"
            )
        param.copy_(tensor)
