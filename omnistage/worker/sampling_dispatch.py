"""`SamplingDispatch`: the one sampling dispatch of every platform, and draft verification.

From the logits of a step's sampling positions to the tokens each batch row emits:

    raw logprobs (when asked) → logits processors → stage transitions
      → the model's own `sample()` when it prefers one, else the default sampler
      → with drafts: how many each row accepts (spec_decode/verify.py)
      → per row: its tokens (and codes), its logprobs

It is written once, here; platform runners (CPU, CUDA) hold it and never replace it
(seeds/001: a platform runner that skipped the dispatch). A row verifying drafts
samples after its newest token and after each draft, position `j` seeing the history
plus the first `j` drafts (what it would be had they been sampled), so the accepted
tokens are the ones it would have sampled without speculation.

Observers (worker/sample_observer.py) see every step's raw logits and sampled ids.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from omnistage.models.base import CausalLM
from omnistage.sample import (
    Sampler,
    SamplingMetadata,
    apply_logits_processors,
    compute_logprobs,
    gather_logprobs,
)
from omnistage.sample.stage_transitions import StageTransitions
from omnistage.spec_decode.verify import accepted_counts
from omnistage.worker.input_batch import RequestState
from omnistage.worker.sample_observer import SampleEvent, SampleObserver


@dataclass
class SampledRows:
    """What one step sampled, by batch row: one token, or with drafts the accepted ones
    and the target's token after them."""

    tokens: dict[int, list[int]]
    codes: dict[int, list[int]]
    """Models with `num_token_codes`: the codes sampled with each row's token."""
    logprobs: dict[int, list[tuple[list[int], list[float], int]]]
    accepted: torch.Tensor | None = None
    """With drafts: [R] how many drafts each sampling row accepted (rows in order)."""


class SamplingDispatch:
    """Samples a step's tokens for the rows of one runner (one per runner)."""

    def __init__(
        self, model: CausalLM, device: torch.device, stage_transitions: StageTransitions | None
    ) -> None:
        self.model = model
        self.device = device
        self.stage_transitions = stage_transitions
        self.sampler = Sampler()
        self.observers: list[SampleObserver] = []
        """Installed observers. Replaced, never changed in place, so a step running on
        another thread iterates a list nobody modifies."""

    def sample(
        self,
        logits: torch.Tensor,
        states: list[RequestState | None],
        rows: list[int],
        drafts: dict[int, list[int]] | None = None,
        outputs_before: list[int] | None = None,
    ) -> SampledRows:
        """Sample the positions of batch rows `rows` (`states`: the batch's states by row)
        from their `logits` [S, V], one position per row, or `1 + len(drafts[row])` for a
        row that verifies drafts. `outputs_before`: per row of `rows`, how many outputs
        precede its first sampled token by the step's positions; each history must hold
        that many (a history one token behind raises, sample/metadata.py).

        A model with `num_token_codes` samples in its own `sample()` and returns, per row,
        the token then its codes."""
        drafts = drafts or {}
        md = self._metadata(states, rows, drafts, outputs_before)
        observers = self.observers
        raw = logits.clone() if observers else None  # processors change `logits` in place
        raw_logprobs = compute_logprobs(logits, md) if md.max_num_logprobs is not None else None
        logits = apply_logits_processors(logits, md)
        if self.stage_transitions is not None:
            self.stage_transitions.apply(logits, md.output_token_ids, md.prompt_token_ids)
        tokens = None
        if self.model.prefer_model_sampler:
            tokens = self.model.sample(logits, md)
        if tokens is None:
            tokens = self.sampler(logits, md)
        if observers:
            event = SampleEvent(
                md.req_ids,
                raw,
                tokens[:, 0] if tokens.ndim == 2 else tokens,
                tokens[:, 1:] if tokens.ndim == 2 else None,
            )
            for observer in observers:
                observer(event)
        codes: dict[int, list[int]] = {}
        if tokens.ndim == 2:  # token, then its codes (never with drafts)
            codes = dict(zip(rows, tokens[:, 1:].tolist(), strict=True))
            tokens = tokens[:, 0].long()  # a float row's token column (token_codes_are_floats)
        flat = tokens.tolist()
        sampled: dict[int, list[int]] = {}
        picks: list[tuple[int, int]] = []  # (row, flat sampling row) of each emitted token
        accepted = None
        if drafts:
            accepted = accepted_counts(tokens, [drafts.get(r, []) for r in rows])
        num_accepted = accepted.tolist() if accepted is not None else [0] * len(rows)
        at = 0
        for row, a in zip(rows, num_accepted, strict=True):
            sampled[row] = flat[at : at + a + 1]
            picks.extend((row, at + j) for j in range(a + 1))
            at += len(drafts.get(row, ())) + 1
        logprobs: dict[int, list[tuple[list[int], list[float], int]]] = {}
        if raw_logprobs is not None:
            ids, lps, ranks = gather_logprobs(raw_logprobs, tokens, md.max_num_logprobs)
            for row, i in picks:
                k = states[row].sampling_params.logprobs
                if k is not None:
                    logprobs.setdefault(row, []).append(
                        (ids[i, : k + 1].tolist(), lps[i, : k + 1].tolist(), int(ranks[i]))
                    )
        return SampledRows(sampled, codes, logprobs, accepted)

    def _metadata(
        self,
        states: list[RequestState | None],
        rows: list[int],
        drafts: dict[int, list[int]],
        outputs_before: list[int] | None,
    ) -> SamplingMetadata:
        """One sampling row per sampled position: a row verifying drafts samples after its
        newest token and after each draft, position `j` seeing the history plus the first
        `j` drafts (what it would be had they been sampled)."""
        entries = []
        counts: list[int] | None = None if outputs_before is None else []
        for i, r in enumerate(rows):
            s = states[r]
            entries.append(s.sampling_row)
            for j in range(1, len(drafts.get(r, ())) + 1):
                entries.append(
                    dataclasses.replace(
                        s.sampling_row, output_token_ids=s.output_token_ids + drafts[r][:j]
                    )
                )
            if counts is not None:
                counts.extend(outputs_before[i] + j for j in range(len(drafts.get(r, ())) + 1))
        return SamplingMetadata.from_requests(entries, self.device, counts)
