"""The default sampler and the logprobs helpers.

    logits [B, V] (after the logits processors)
      ├─ greedy rows (temperature 0) ──────────────────────────────▶ argmax
      └─ random rows: / temperature ─▶ top-k ─▶ top-p ─▶ min-p ─▶ softmax
                       ─▶ argmax(probs / q),  q ~ Exp(1) per vocab entry

The exponential race picks token i with probability probs[i]. `q[i]` of a row is
a function of a hash of (seed, output position) and of i only (a counter-based
draw, `race_draws`), so a row gets the same token alone, in any batch, at any
row, and after being preempted and recomputed (DESIGN.md invariant 3). Every
filter is computed per row from that row's values only, for the same reason.

Filters keep ties at their boundary: top-k keeps every token whose logit is at
least the k-th largest; top-p keeps every token at least as likely as the one at
which the sorted cumulative probability first reaches top_p; min-p keeps every
token with probability >= min_p * max probability.

Work is float32 (float64 inputs stay float64).
"""

from __future__ import annotations

import ctypes
from typing import NamedTuple

import numpy as np
import torch

from omnistage import kernels
from omnistage.sample.metadata import SAMPLING_EPS, SamplingMetadata

_MASK63 = (1 << 63) - 1
_MASK64 = (1 << 64) - 1
# Top-p looks for its cutoff among this many most likely tokens before sorting a row.
_TOP_P_PREFIX = 256
# ... and, for a row whose nucleus is wider (on the CPU, in C), among this many before a
# full sort of the row.
_TOP_P_WIDE_PREFIX = 4096


def row_argmax(x: torch.Tensor) -> torch.Tensor:
    """`x.argmax(dim=-1)`: the first maximal entry of each row (NaN counting as maximal),
    int64. A float32 / float64 CPU tensor goes through numpy, whose vectorized argmax
    takes ~3 us over a 49152-entry row where torch 2.13's takes ~44 us (measured on Zen 4,
    one or two threads): a step of greedy decoding calls it once."""
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64):
        return torch.from_numpy(np.asarray(x.detach().numpy().argmax(axis=-1), dtype=np.int64))
    return x.argmax(dim=-1)


class LogprobsTensors(NamedTuple):
    """Per row: the sampled token first, then the top-k tokens by raw logprob."""

    token_ids: torch.Tensor
    """[B, k + 1] int64."""

    logprobs: torch.Tensor
    """[B, k + 1] raw logprobs of `token_ids`."""

    ranks: torch.Tensor
    """[B] int64: 1 + number of tokens with a strictly greater logprob than the sampled one."""


def compute_logprobs(logits: torch.Tensor, md: SamplingMetadata | None = None) -> torch.Tensor:
    """Raw logprobs [B, V]: log-softmax of the model's logits, before any processing.

    Returns a new tensor, so the logits processors may then edit `logits` in place.
    """
    del md  # raw logprobs do not depend on sampling settings
    return torch.log_softmax(logits.to(_work_dtype(logits)), dim=-1)


def gather_logprobs(raw_logprobs: torch.Tensor, sampled: torch.Tensor, k: int) -> LogprobsTensors:
    """Pick the sampled token's logprob and the top-k per row from `compute_logprobs`' output."""
    sampled = sampled.to(torch.int64).unsqueeze(1)
    sampled_logprobs = raw_logprobs.gather(1, sampled)
    ranks = (raw_logprobs > sampled_logprobs).sum(dim=-1) + 1
    if k > 0:
        top_logprobs, top_ids = raw_logprobs.topk(k, dim=-1)
        token_ids = torch.cat([sampled, top_ids], dim=1)
        logprobs = torch.cat([sampled_logprobs, top_logprobs], dim=1)
    else:
        token_ids, logprobs = sampled, sampled_logprobs
    return LogprobsTensors(token_ids, logprobs, ranks)


def row_seed(seed: int, position: int) -> int:
    """The generator seed of one draw: a splitmix64 hash of (seed, output position)."""
    x = (seed * 1_000_003 + position) & _MASK64
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) & _MASK63


class Sampler:
    """The default sampler: greedy, temperature, top-k, top-p, min-p, seeded per row.

    Stateless: every draw is reseeded from (seed, output position), so one
    instance may be shared, and a fresh one samples exactly like an old one.

    `top_p_first` orders the two filters: False (vLLM's order) keeps the top-k, then the
    top-p of what is left, renormalized; True (CosyVoice's `nucleus_sampling`) keeps the
    top-p of the whole distribution, then at most top-k of those.
    """

    def __init__(self, top_p_first: bool = False) -> None:
        self.top_p_first = top_p_first

    def __call__(self, logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        """Sample one token per row of `logits` [B, V]; returns [B] int64.

        Does not modify `logits`.
        """
        if md.all_greedy:
            return row_argmax(logits)
        if md.all_random:
            return self._sample_random(logits, md, rows=None)
        greedy = row_argmax(logits)
        random_rows = (md.temperature >= SAMPLING_EPS).nonzero().flatten()
        if random_rows.numel() > 0:
            greedy[random_rows] = self._sample_random(logits[random_rows], md, random_rows)
        return greedy

    def _sample_random(
        self, logits: torch.Tensor, md: SamplingMetadata, rows: torch.Tensor | None
    ) -> torch.Tensor:
        """Sample the random rows; `logits` holds exactly those rows (`rows` maps them back)."""

        def pick(values: torch.Tensor | None) -> torch.Tensor | None:
            if values is None or rows is None:
                return values
            return values[rows]

        dtype = _work_dtype(logits)
        temperature = pick(md.temperature).to(device=logits.device, dtype=dtype)
        scaled = logits.to(dtype) / temperature.unsqueeze(1)
        _apply_top_k_top_p(scaled, pick(md.top_k), pick(md.top_p), self.top_p_first)
        if md.min_p is not None:
            _apply_min_p(scaled, pick(md.min_p))
        probs = torch.softmax(scaled, dim=-1)
        row_ids = range(md.num_rows) if rows is None else rows.tolist()
        return self.race(probs, [(md.seeds[r], md.output_positions[r]) for r in row_ids])

    @classmethod
    def race(cls, probs: torch.Tensor, keys: list[tuple[int, int]]) -> torch.Tensor:
        """[R] int64: each row's pick of the exponential race, `argmax(probs / q)` with `q`
        the row's `exponentials`. Contiguous float32 CPU rows take one C call
        (`race_pick_f32`: the same picks, drawing only tokens of nonzero probability);
        other rows divide by the whole draws."""
        lib = _c_kernels_for(probs)
        if lib is None or not probs.is_contiguous() or probs.ndim != 2:
            return row_argmax(probs.div_(cls.exponentials(probs, keys)))
        draw_keys = torch.tensor([row_seed(seed, position) for seed, position in keys])
        picks = torch.empty(len(keys), dtype=torch.int64)
        rows, vocab = probs.shape
        lib.race_pick_f32(
            probs.data_ptr(),
            rows,
            vocab,
            draw_keys.data_ptr(),
            picks.data_ptr(),
            torch.get_num_threads(),
        )
        return picks

    @staticmethod
    def exponentials(probs: torch.Tensor, keys: list[tuple[int, int]]) -> torch.Tensor:
        """[R, V] Exp(1) draws in `probs`' dtype: row i's keyed by `row_seed(*keys[i])`,
        token j's a pure function of that key and j (`race_draws`)."""
        draw_keys = [row_seed(seed, position) for seed, position in keys]
        return race_draws(draw_keys, probs.shape[-1], probs.device).to(probs.dtype)


_GOLDEN = 0x9E3779B97F4A7C15


def race_draws(keys: list[int], vocab: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[len(keys), vocab] float32 Exp(1) draws: q = -log(u), u = (2m + 1) / 2^24 where m is
    the top 23 bits of splitmix64(key + (j + 1) * golden ratio). A counter-based draw: no
    generator state, each row and token computed alone, in C on the CPU
    (`kernels/sample_race.c`, ~1-2 ns a draw) or in torch's 64-bit integer ops elsewhere
    (the same u; `torch.log` may differ from the C log in the last bit)."""
    rows = len(keys)
    key_tensor = torch.tensor(keys, dtype=torch.int64)  # row_seed keys are < 2**63
    if torch.device(device).type == "cpu" and rows:
        lib = kernels.load()
        if lib is not None:
            q = torch.empty(rows, vocab, dtype=torch.float32)
            lib.race_exponentials_f32(
                key_tensor.data_ptr(), rows, vocab, q.data_ptr(), torch.get_num_threads()
            )
            return q
    z = key_tensor.to(device).unsqueeze(1) + (
        torch.arange(1, vocab + 1, dtype=torch.int64, device=device) * _signed(_GOLDEN)
    )  # int64 arithmetic wraps as uint64's does
    z = (z ^ _shift_right(z, 30)) * _signed(0xBF58476D1CE4E5B9)
    z = (z ^ _shift_right(z, 27)) * _signed(0x94D049BB133111EB)
    z = z ^ _shift_right(z, 31)
    u = (_shift_right(z, 41) * 2 + 1).to(torch.float32) * 2.0**-24
    return u.log_().neg_()


def _signed(value: int) -> int:
    """A 64-bit unsigned constant as the int64 with the same bits."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical (unsigned) right shift of int64 values."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _apply_top_k_top_p(
    logits: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    top_p_first: bool,
) -> None:
    """Set logits outside each row's top-k, then top-p (or top-p, then top-k), to -inf,
    in place."""
    if top_p_first and top_p is not None:
        _apply_top_p(logits, top_p)
    if top_k is not None:
        _apply_top_k(logits, top_k)
    if top_p is not None and not top_p_first:
        _apply_top_p(logits, top_p)


def _apply_top_k(logits: torch.Tensor, top_k: torch.Tensor) -> None:
    """Keep the logits >= each row's k-th largest (ties at the boundary are all kept)."""
    vocab = logits.shape[-1]
    k = top_k.to(device=logits.device, dtype=torch.int64)
    if _top_k_in_c(logits, k):
        return
    filtered = (k > 0) & (k < vocab)
    if bool(filtered.all()):  # every row: no copy of the rows out and back
        kth = logits.topk(int(k.max()), dim=-1).values.gather(1, k.unsqueeze(1) - 1)
        logits.masked_fill_(logits < kth, float("-inf"))
        return
    rows = filtered.nonzero().flatten()
    if rows.numel() == 0:
        return
    k = k[rows].unsqueeze(1)
    sub = logits[rows]
    # A partial top-k of the largest k is far cheaper than a full sort.
    kth = sub.topk(int(k.max()), dim=-1).values.gather(1, k - 1)
    logits[rows] = sub.masked_fill_(sub < kth, float("-inf"))


def _c_kernels_for(*tensors: torch.Tensor) -> ctypes.CDLL | None:
    """The C kernel library where every tensor is a float32 CPU one and it is built here
    (the sampler's C paths take those), else None."""
    if any(t.dtype != torch.float32 or not t.is_cpu for t in tensors):
        return None
    return kernels.load()


def _top_k_in_c(logits: torch.Tensor, k: torch.Tensor) -> bool:
    """`_apply_top_k` of contiguous float32 CPU rows in one C call (`top_k_mask_f32`: the
    same k-th largest, the same rows filtered); False where it does not apply (another
    dtype or device, no C kernels, a NaN in a row: the torch path then runs)."""
    lib = _c_kernels_for(logits)
    if lib is None or not logits.is_contiguous():
        return False
    k = k.contiguous()
    rows, vocab = logits.shape
    heap = min(max(1, int(k.max())) if rows else 1, vocab)
    scratch = torch.empty(rows, heap, dtype=torch.float32)
    nan_rows = lib.top_k_mask_f32(
        logits.data_ptr(),
        rows,
        vocab,
        k.data_ptr(),
        scratch.data_ptr(),
        heap,
        torch.get_num_threads(),
    )
    return not nan_rows


def _apply_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> None:
    """Keep the smallest prefix of tokens (by probability) whose mass reaches top_p.

    Token i of the sorted order is kept while the mass before it is < top_p, so
    the most likely token always stays; every token as likely as the last kept
    one stays too (ties). Rows with top_p >= 1 are left alone. The cutoff is looked
    for in the top `_TOP_P_PREFIX` tokens first; only rows whose nucleus is
    larger pay for a full sort. Both give the same cutoff, so a row's result
    never depends on the other rows.
    """
    p = top_p.to(device=logits.device, dtype=logits.dtype)
    rows = (p < 1.0).nonzero().flatten()
    if rows.numel() == 0:
        return
    every_row = rows.numel() == logits.shape[0]  # then in place: no copy out and back
    p = (p if every_row else p[rows]).unsqueeze(1)
    sub = logits if every_row else logits[rows]
    probs = torch.softmax(sub, dim=-1)
    decided = _top_p_cutoff_in_c(probs, p)
    if decided is None:
        prefix = probs.topk(min(_TOP_P_PREFIX, probs.shape[-1]), dim=-1).values
        decided = _top_p_cutoff(prefix, p)
    cutoff, resolved = decided
    unresolved = (~resolved).nonzero().flatten()
    if unresolved.numel() > 0 and probs.shape[-1] > _TOP_P_WIDE_PREFIX:
        wider = _top_p_cutoff_in_c(probs[unresolved], p[unresolved], _TOP_P_WIDE_PREFIX)
        if wider is not None:  # a wide nucleus: its 4096 largest before a full sort
            cutoff[unresolved], resolved[unresolved] = wider
            unresolved = (~resolved).nonzero().flatten()
    if unresolved.numel() > 0:
        full = probs[unresolved].sort(dim=-1, descending=True).values
        cutoff[unresolved] = _top_p_cutoff(full, p[unresolved])[0]
    sub.masked_fill_(probs < cutoff, float("-inf"))
    if not every_row:
        logits[rows] = sub


def _top_p_cutoff_in_c(
    probs: torch.Tensor, p: torch.Tensor, prefix: int = _TOP_P_PREFIX
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`_top_p_cutoff` of each row's `prefix` largest probabilities in one C call
    (`top_p_cutoff_f32`: the same sorted values, summed as torch's CPU cumsum sums them, so
    a row it resolves has the cutoff of the row's full sort), without `topk`'s partial
    sort; None where it does not apply (not float32 CPU rows, no C kernels)."""
    lib = _c_kernels_for(probs, p)
    if lib is None:
        return None
    probs, p = probs.contiguous(), p.contiguous()
    rows, vocab = probs.shape
    cutoff = torch.empty(rows, 1, dtype=torch.float32)
    resolved = torch.empty(rows, dtype=torch.bool)
    scratch = torch.empty(rows, min(prefix, vocab), dtype=torch.float32)
    lib.top_p_cutoff_f32(
        probs.data_ptr(),
        rows,
        vocab,
        p.data_ptr(),
        prefix,
        cutoff.data_ptr(),
        resolved.data_ptr(),
        scratch.data_ptr(),
        torch.get_num_threads(),
    )
    return cutoff, resolved


def _top_p_cutoff(sorted_probs: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the probability of the last kept token [R, 1], whether this prefix decided it [R])."""
    cumulative = sorted_probs.cumsum(dim=-1)
    keep = 1 + (cumulative[:, :-1] < p).sum(dim=-1, keepdim=True)
    resolved = (cumulative[:, -1:] >= p).squeeze(1)
    return sorted_probs.gather(1, keep - 1), resolved


def _apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> None:
    """Drop tokens with probability < min_p * max probability (compared in logit space)."""
    min_p = min_p.to(device=logits.device, dtype=logits.dtype).unsqueeze(1)
    # p_i < min_p * p_max  <=>  logit_i < logit_max + log(min_p); log(0) = -inf keeps all.
    cutoff = logits.amax(dim=-1, keepdim=True) + torch.log(min_p)
    logits.masked_fill_(logits < cutoff, float("-inf"))


def _work_dtype(tensor: torch.Tensor) -> torch.dtype:
    return torch.float64 if tensor.dtype == torch.float64 else torch.float32
