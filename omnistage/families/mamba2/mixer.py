"""`Mamba2Mixer`: the Mamba2 token mixer of one layer, on the recurrent-state hot path.

    in_proj(x) -> z (gate) | xBC | dt
    xBC -> causal depthwise conv1d (+ conv state) -> silu -> x, B, C
    SSM: h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T,  y_t = h_t C_t + D x_t
    y -> gated RMSNorm (y * silu(z), normalised per group) -> out_proj

Per-request state lives in state slots beside the KV blocks (worker/recurrent.py):
per layer a conv state `[conv_dim, conv_kernel - 1]` (the last inputs of the conv)
and an SSM state `[num_heads, head_dim, state_size]`. The step's requests come
from `get_forward_context().recurrent`; a request that starts at position 0
starts from zeros (`has_initial_state`). Single-token decodes run together in
the recurrent form; multi-token prefill chunks run one request at a time in the
chunked (SSD) form (`families/mamba2/scan.py`); speculative verification rows
(`spec_lens > 0`) run token by token in the recurrent form and save the state
after each token into the scratch slots.

The SSM is computed in at least float32 (float64 models keep float64).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.mamba2.scan import recurrent_ssm_step, ssd_chunk_scan
from omnistage.layers.forward_context import get_forward_context
from omnistage.layers.linear import Linear
from omnistage.layers.recurrent_state import RecurrentLayerState, RecurrentMetadata


class GatedRMSNorm(nn.Module):
    """`weight * rmsnorm_per_group(x * silu(gate))` (transformers' `MambaRMSNormGated`,
    norm after gate)."""

    def __init__(self, size: int, group_size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype), requires_grad=False)
        self.group_size = group_size
        self.eps = eps
        self.compute_dtype = torch.promote_types(dtype, torch.float32)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(self.compute_dtype) * F.silu(gate.to(self.compute_dtype))
        groups = x.view(*x.shape[:-1], -1, self.group_size)
        groups = groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * groups.view(x.shape).to(dtype)


class Mamba2Mixer(nn.Module):
    """The Mamba2 mixer of one layer (HF parameter names under `mixer.`)."""

    def __init__(self, config: Any, dtype: torch.dtype) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        self.state_size = config.state_size
        self.n_groups = config.n_groups
        self.intermediate_size = int(config.expand * hidden)
        self.conv_kernel = config.conv_kernel
        self.conv_dim = self.intermediate_size + 2 * self.n_groups * self.state_size
        self.chunk_size = config.chunk_size
        limit = tuple(getattr(config, "time_step_limit", None) or (0.0, float("inf")))
        self.dt_min, self.dt_max = float(limit[0]), float(limit[1])
        self.dtype = dtype
        self.compute_dtype = torch.promote_types(dtype, torch.float32)
        if config.hidden_act != "silu":
            raise ValueError(f"hidden_act: Mamba2 supports silu only, got {config.hidden_act!r}")
        self.in_proj = Linear(
            hidden, self.intermediate_size + self.conv_dim + self.num_heads, config.use_bias, dtype
        )
        self.conv1d = nn.Conv1d(
            self.conv_dim,
            self.conv_dim,
            self.conv_kernel,
            groups=self.conv_dim,
            bias=config.use_conv_bias,
            dtype=dtype,
        )
        self.conv1d.requires_grad_(False)
        self.dt_bias = nn.Parameter(torch.zeros(self.num_heads, dtype=dtype), requires_grad=False)
        self.A_log = nn.Parameter(torch.zeros(self.num_heads, dtype=dtype), requires_grad=False)
        self.D = nn.Parameter(torch.ones(self.num_heads, dtype=dtype), requires_grad=False)
        self.norm = GatedRMSNorm(
            self.intermediate_size,
            self.intermediate_size // self.n_groups,
            config.layer_norm_epsilon,
            dtype,
        )
        self.out_proj = Linear(self.intermediate_size, hidden, config.use_bias, dtype)
        self.state: RecurrentLayerState | None = None

    def state_shapes(self) -> tuple[tuple[int, ...], ...]:
        """Per slot: the conv state (the last `conv_kernel - 1` conv inputs) and the SSM state."""
        return (
            (self.conv_dim, self.conv_kernel - 1),
            (self.num_heads, self.head_dim, self.state_size),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        meta = get_forward_context().recurrent
        if meta is None or self.state is None:
            raise RuntimeError("Mamba2 layer run without recurrent metadata or bound state")
        z, xbc, dt = self.in_proj(x).split(
            [self.intermediate_size, self.conv_dim, self.num_heads], dim=-1
        )
        xbc = F.silu(self._conv(xbc, meta))
        groups = self.n_groups * self.state_size
        xs, B, C = xbc.split([self.intermediate_size, groups, groups], dim=-1)
        y = self._ssm(xs, B, C, dt, meta)
        return self.out_proj(self.norm(y, z))

    # -- causal conv ---------------------------------------------------------------------
    def _conv(self, xbc: torch.Tensor, meta: RecurrentMetadata) -> torch.Tensor:
        """Depthwise causal conv of the step's tokens ([T, conv_dim], before the activation),
        each request continuing from its conv state; writes the new conv states."""
        conv_state = self.state.tensors[0]
        slots = meta.state_slots
        init = conv_state.index_select(0, slots).to(xbc.dtype)
        init = torch.where(meta.has_initial_state[:, None, None], init, torch.zeros_like(init))
        decodes, others = _split_decodes(meta)
        weight, bias = self.conv1d.weight, self.conv1d.bias
        out = torch.empty_like(xbc)
        if decodes:
            idx = torch.tensor(decodes, device=xbc.device)
            tok = torch.tensor([meta.query_start_loc[r] for r in decodes], device=xbc.device)
            window = torch.cat([init[idx], xbc[tok].unsqueeze(-1)], dim=-1)  # [R, C, K]
            conv = (window * weight[:, 0]).sum(-1)
            out[tok] = conv if bias is None else conv + bias
            conv_state.index_copy_(0, slots[idx], window[:, :, 1:].to(conv_state.dtype))
        width = self.conv_kernel - 1
        for r in others:
            s, e = meta.query_start_loc[r], meta.query_start_loc[r + 1]
            seq = torch.cat([init[r], xbc[s:e].t()], dim=-1)  # [C, K - 1 + n]
            out[s:e] = F.conv1d(seq.unsqueeze(0), weight, bias, groups=self.conv_dim)[0].t()
            slot = slots[r : r + 1]
            conv_state.index_copy_(0, slot, seq[None, :, -width:].to(conv_state.dtype))
            q = meta.spec_lens[r]
            if q:  # the conv state after token j: the `width` inputs ending at token j
                windows = seq.unfold(1, width, 1)[:, 1 : q + 1].transpose(0, 1)  # [q, C, width]
                self._scratch(0)[slot, :q] = windows.unsqueeze(0).to(conv_state.dtype)
        return out

    # -- SSM ---------------------------------------------------------------------------------
    def _ssm(
        self,
        xs: torch.Tensor,
        B: torch.Tensor,
        C: torch.Tensor,
        dt: torch.Tensor,
        meta: RecurrentMetadata,
    ) -> torch.Tensor:
        """The selective scan of the step's tokens -> [T, intermediate]; writes the new SSM
        states (and, for speculative rows, the per-token scratch states)."""
        cd, heads, head_dim = self.compute_dtype, self.num_heads, self.head_dim
        tokens = xs.shape[0]
        per_group = heads // self.n_groups
        A = -torch.exp(self.A_log.to(cd))
        dt = F.softplus(dt.to(cd) + self.dt_bias.to(cd)).clamp(self.dt_min, self.dt_max)
        x = xs.to(cd).view(tokens, heads, head_dim)
        B = B.to(cd).view(tokens, self.n_groups, -1).repeat_interleave(per_group, dim=1)
        C = C.to(cd).view(tokens, self.n_groups, -1).repeat_interleave(per_group, dim=1)
        ssm_state = self.state.tensors[1]
        slots = meta.state_slots
        init = ssm_state.index_select(0, slots).to(cd)
        init = torch.where(
            meta.has_initial_state[:, None, None, None], init, torch.zeros_like(init)
        )
        y = torch.empty_like(x)
        decodes, others = _split_decodes(meta)
        if decodes:
            idx = torch.tensor(decodes, device=x.device)
            tok = torch.tensor([meta.query_start_loc[r] for r in decodes], device=x.device)
            state = recurrent_ssm_step(init[idx], x[tok], dt[tok], A, B[tok], C[tok])
            y[tok] = (state @ C[tok].unsqueeze(-1)).squeeze(-1)
            ssm_state.index_copy_(0, slots[idx], state.to(ssm_state.dtype))
        for r in others:
            s, e = meta.query_start_loc[r], meta.query_start_loc[r + 1]
            slot = slots[r : r + 1]
            if meta.spec_lens[r]:
                y[s:e], final = self._spec_scan(slot, init[r], x[s:e], dt[s:e], A, B[s:e], C[s:e])
            else:
                y[s:e], final = ssd_chunk_scan(
                    x[s:e], dt[s:e], A, B[s:e], C[s:e], self.chunk_size, init[r]
                )
            ssm_state.index_copy_(0, slot, final[None].to(ssm_state.dtype))
        y = y + self.D.to(cd)[:, None] * x
        return y.reshape(tokens, heads * head_dim).to(self.dtype)

    def _spec_scan(
        self,
        slot: torch.Tensor,
        state: torch.Tensor,
        x: torch.Tensor,
        dt: torch.Tensor,
        A: torch.Tensor,
        B: torch.Tensor,
        C: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A verification row token by token, saving the state after each into scratch."""
        outs, states = [], []
        for j in range(x.shape[0]):
            state = recurrent_ssm_step(
                state[None], x[j : j + 1], dt[j : j + 1], A, B[j : j + 1], C[j : j + 1]
            )[0]
            outs.append(state @ C[j].unsqueeze(-1))
            states.append(state)
        scratch = self._scratch(1)
        scratch[slot, : len(states)] = torch.stack(states).unsqueeze(0).to(scratch.dtype)
        return torch.stack(outs).squeeze(-1), state

    def _scratch(self, i: int) -> torch.Tensor:
        if self.state.scratch is None:
            raise RuntimeError("a speculative row (spec_lens > 0) needs scratch recurrent state")
        return self.state.scratch[i]


def _split_decodes(meta: RecurrentMetadata) -> tuple[list[int], list[int]]:
    """Indices of the single-token, non-speculative requests and of the others."""
    decodes, others = [], []
    for r, (n, q) in enumerate(zip(meta.query_lens, meta.spec_lens, strict=True)):
        (decodes if n == 1 and q == 0 else others).append(r)
    return decodes, others
