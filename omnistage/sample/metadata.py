"""`SamplingMetadata`: everything the sampling pipeline needs for one step.

The model runner builds one per step, one row per sequence being sampled, and
hands it to `compute_logprobs`, `apply_logits_processors` and `Sampler` (in that
order, DESIGN.md §5). Optional tensors are `None` when no row uses the feature,
so the common case (no penalties, no top-k/top-p/min-p) costs nothing.

Token lists here are real sampled tokens only — never placeholders (DESIGN.md
invariant 1). Randomness is keyed by `(seeds[row], output_positions[row])`, so
a row samples the same token whatever batch it sits in (invariant 3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from omnistage.sampling_params import SamplingParams

# Temperatures below this are treated as greedy: dividing logits by a near-zero
# temperature only risks overflow and gives the argmax anyway.
SAMPLING_EPS = 1e-5


@dataclass
class RowSamplingState:
    """What `SamplingMetadata.from_requests` needs to know about one row."""

    sampling_params: SamplingParams
    """The sequence's sampling parameters."""

    seed: int
    """The sequence's sampling seed (the request seed, or one drawn at admission)."""

    prompt_token_ids: list[int]
    """Prompt tokens (read by the repetition penalty)."""

    output_token_ids: list[int]
    """Real output tokens generated so far (no placeholders)."""

    eos_token_id: int | None = None
    """End-of-sequence id masked by `min_tokens` (unless `ignore_eos`)."""

    output_position: int | None = None
    """Index among the outputs of the token sampled now; default `len(output_token_ids)`."""

    req_id: str = ""
    """The sequence's request id (model samplers key per-request state by it, never by row)."""

    output_codes: list[list[int | float]] | None = None
    """Models with `num_token_codes`: the codes (or float rows) of each real output so far,
    the runner's own list (read by model samplers that continue from them)."""


@dataclass
class SamplingMetadata:
    """Per-step, per-row sampling inputs. Row `i` of every field is the same sequence."""

    temperature: torch.Tensor
    """[B] float32; 0.0 marks a greedy row."""

    all_greedy: bool
    """Every row is greedy: the sampler only takes the argmax."""

    all_random: bool
    """No row is greedy: the sampler skips the greedy/random split."""

    top_k: torch.Tensor | None
    """[B] int64; 0 (or >= vocab) disables it for a row. None when no row uses it."""

    top_p: torch.Tensor | None
    """[B] float32; 1.0 disables it for a row. None when no row uses it."""

    min_p: torch.Tensor | None
    """[B] float32; 0.0 disables it for a row. None when no row uses it."""

    seeds: list[int]
    """Per row: the sequence's sampling seed (always set)."""

    output_positions: list[int]
    """Per row: index among the outputs of the token being sampled now."""

    output_token_ids: list[list[int]]
    """Per row: the real output history (no placeholders, ever)."""

    prompt_token_ids: list[list[int]]
    """Per row: the prompt tokens."""

    presence_penalties: torch.Tensor | None
    """[B] float32. The three penalty tensors are all None when no row has any penalty."""

    frequency_penalties: torch.Tensor | None
    """[B] float32."""

    repetition_penalties: torch.Tensor | None
    """[B] float32."""

    logit_bias: list[dict[int, float] | None]
    """Per row: token id -> bias added to its logit, or None."""

    min_tokens: list[tuple[int, list[int]] | None]
    """Per row: (min_tokens, ids masked until that many outputs exist), or None."""

    max_num_logprobs: int | None
    """Largest `logprobs` asked by any row; None when no row asks for logprobs."""

    req_ids: list[str] = field(default_factory=list)
    """Per row: the request id (for samplers that keep per-request state)."""

    sampling_params: list[SamplingParams] = field(default_factory=list)
    """Per row: the request's sampling parameters."""

    output_codes: list[list[list[int | float]] | None] = field(default_factory=list)
    """Per row: `RowSamplingState.output_codes` (codes of the real outputs, no placeholders)."""

    @property
    def num_rows(self) -> int:
        return len(self.seeds)

    @classmethod
    def from_requests(
        cls,
        rows: Sequence[RowSamplingState],
        device: torch.device | str = "cpu",
        outputs_before: Sequence[int] | None = None,
    ) -> SamplingMetadata:
        """Build the metadata of one step from per-row states (a convenience builder).

        Temperatures below `SAMPLING_EPS` become 0.0 (greedy). Greedy rows never
        turn on top-k/top-p/min-p, so a fully greedy batch carries no filter tensors.

        `outputs_before` (the model runner gives it): per row, how many outputs come
        before the token sampled now, counted from the positions the step computed,
        not from the history. Each history must hold exactly that many tokens
        (`check_histories_current`).
        """
        if outputs_before is not None:
            check_histories_current(rows, outputs_before)
        params = [row.sampling_params for row in rows]
        temps = [0.0 if p.temperature < SAMPLING_EPS else float(p.temperature) for p in params]
        random_rows = [t > 0.0 for t in temps]

        def optional(values: list, off: object, dtype: torch.dtype) -> torch.Tensor | None:
            if all(v == off for v in values):
                return None
            return torch.tensor(values, dtype=dtype, device=device)

        top_k = [
            p.top_k if r and p.top_k > 0 else 0 for p, r in zip(params, random_rows, strict=True)
        ]
        top_p = [p.top_p if r else 1.0 for p, r in zip(params, random_rows, strict=True)]
        min_p = [p.min_p if r else 0.0 for p, r in zip(params, random_rows, strict=True)]

        has_penalty = any(
            p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 or p.repetition_penalty != 1.0
            for p in params
        )

        def penalty(name: str) -> torch.Tensor | None:
            if not has_penalty:
                return None
            return torch.tensor(
                [getattr(p, name) for p in params], dtype=torch.float32, device=device
            )

        asked = [p.logprobs for p in params if p.logprobs is not None]
        return cls(
            temperature=torch.tensor(temps, dtype=torch.float32, device=device),
            all_greedy=not any(random_rows),
            all_random=all(random_rows),
            top_k=optional(top_k, 0, torch.int64),
            top_p=optional(top_p, 1.0, torch.float32),
            min_p=optional(min_p, 0.0, torch.float32),
            seeds=[row.seed for row in rows],
            output_positions=[
                len(row.output_token_ids) if row.output_position is None else row.output_position
                for row in rows
            ],
            output_token_ids=[row.output_token_ids for row in rows],
            req_ids=[row.req_id for row in rows],
            sampling_params=params,
            output_codes=[row.output_codes for row in rows],
            prompt_token_ids=[row.prompt_token_ids for row in rows],
            presence_penalties=penalty("presence_penalty"),
            frequency_penalties=penalty("frequency_penalty"),
            repetition_penalties=penalty("repetition_penalty"),
            logit_bias=[p.logit_bias or None for p in params],
            min_tokens=[_min_tokens_entry(row) for row in rows],
            max_num_logprobs=max(asked) if asked else None,
        )


def check_histories_current(
    rows: Sequence[RowSamplingState], outputs_before: Sequence[int]
) -> None:
    """Raise unless each row's history holds exactly `outputs_before[row]` tokens.

    The count comes from the step's positions (tokens computed plus tokens fed, less
    drafts and prompt), an account kept apart from the history list: a history one
    token behind (step N's token not yet written when step N+1 samples, seeds/000)
    or one ahead of the positions is refused, instead of sampling position N+1 from
    the history of position N (invariant 1).
    """
    if len(outputs_before) != len(rows):
        raise RuntimeError(f"sampling: {len(outputs_before)} output counts for {len(rows)} rows")
    for row, expected in zip(rows, outputs_before, strict=True):
        held = len(row.output_token_ids)
        if held != expected:
            raise RuntimeError(
                f"sampling: request {row.req_id!r} samples output {expected} but its token "
                f"history holds {held} tokens; the history must hold every token sampled "
                "before this step (DESIGN.md invariant 1)"
            )


def _min_tokens_entry(row: RowSamplingState) -> tuple[int, list[int]] | None:
    """(min_tokens, ids to mask) while the row is still short of min_tokens, else None."""
    params = row.sampling_params
    if len(row.output_token_ids) >= params.min_tokens:
        return None
    ids = list(params.stop_token_ids or [])
    if row.eos_token_id is not None and not params.ignore_eos:
        ids.append(row.eos_token_id)
    if not ids:
        return None
    return (params.min_tokens, sorted(set(ids)))
