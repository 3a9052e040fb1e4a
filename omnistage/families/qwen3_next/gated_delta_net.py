"""`GatedDeltaNet`: the linear-attention token mixer of Qwen3-Next and Qwen3.5.

The projected tokens go through a causal depthwise conv1d (kernel K, SiLU;
`families/qwen3_next/causal_conv1d.py`) that yields q, k, v, then through the gated delta rule
(`families/qwen3_next/gated_delta_rule.py`), then a gated RMSNorm and the output projection. So
each request carries two states between steps: the last K-1 conv inputs and the
delta rule's state S.

The layer is on the hot path: it reads the step's `RecurrentMetadata` from the
forward context, gathers the states of the scheduled requests by `state_slots`
(zeros where `has_initial_state` is False), runs decodes together and prefills one
request at a time, runs speculative-verification rows token by token and saves
their state after every token into the layer's scratch tensors, and writes the
states back. State layout per slot: conv `[K - 1, conv_dim]`, recurrent
`[Hv, dk, dv]`, in the model's dtype; the arithmetic runs in at least float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.qwen3_next.causal_conv1d import causal_conv1d, causal_conv1d_step
from omnistage.families.qwen3_next.gated_delta_rule import (
    DEFAULT_CHUNK_SIZE,
    chunked_gated_delta_rule,
    l2_normalize,
    recurrent_gated_delta_rule,
    recurrent_gated_delta_step,
)
from omnistage.layers.forward_context import get_forward_context
from omnistage.layers.linear import Linear, load_shard


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
