"""Built-in logits processors: logit bias, min-tokens masking, penalties.

`apply_logits_processors` runs them in a fixed order on the [B, V] logits, in
place, after the raw logprobs were taken and before the sampler (DESIGN.md §5):

    logit_bias  ->  min_tokens  ->  repetition / frequency / presence penalties

Each one returns at once when no row of the batch uses it, so the common case
costs a few Python checks. Semantics follow vLLM / OpenAI:

- repetition penalty `r` over tokens seen in the prompt OR the output:
  a positive logit is divided by `r`, any other is multiplied by `r`;
- frequency penalty `f`: subtract `f * (times the token appears in the output)`;
- presence penalty `p`: subtract `p` from every token that appears in the output.

Token histories are real tokens only (invariant 1): a negative id is a leaked
placeholder and raises instead of being silently counted.
"""

from __future__ import annotations

import itertools

import torch

from omnistage.sample.metadata import SamplingMetadata


def apply_logits_processors(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """Apply logit bias, min-tokens masking and penalties to `logits` [B, V] in place."""
    apply_logit_bias(logits, md)
    apply_min_tokens(logits, md)
    apply_penalties(logits, md)
    return logits


def apply_logit_bias(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """Add each row's `logit_bias[token]` to `logits[row, token]`, in place."""
    rows: list[int] = []
    ids: list[int] = []
    values: list[float] = []
    for row, bias in enumerate(md.logit_bias):
        if bias:
            rows.extend([row] * len(bias))
            ids.extend(bias.keys())
            values.extend(bias.values())
    if not rows:
        return logits
    _check_ids_in_vocab("logit_bias", ids, logits.shape[-1])
    device = logits.device
    # (row, id) pairs are unique (dict keys), so a plain indexed add is exact.
    logits[_tensor(rows, device), _tensor(ids, device)] += torch.tensor(
        values, dtype=logits.dtype, device=device
    )
    return logits


def apply_min_tokens(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """Set the listed ids (EOS, stop ids) to -inf in rows short of their `min_tokens`."""
    rows: list[int] = []
    ids: list[int] = []
    for row, entry in enumerate(md.min_tokens):
        if entry is None:
            continue
        min_tokens, masked = entry
        if len(md.output_token_ids[row]) < min_tokens and masked:
            rows.extend([row] * len(masked))
            ids.extend(masked)
    if not rows:
        return logits
    _check_ids_in_vocab("min_tokens", ids, logits.shape[-1])
    logits[_tensor(rows, logits.device), _tensor(ids, logits.device)] = float("-inf")
    return logits


def apply_penalties(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """Apply repetition, frequency and presence penalties in place (vLLM order).

    Only rows with a non-default penalty are touched; the three tensors being
    None means no row has one and nothing is done.
    """
    if (
        md.presence_penalties is None
        and md.frequency_penalties is None
        and md.repetition_penalties is None
    ):
        return logits
    num_rows, vocab = logits.shape
    device, dtype = logits.device, logits.dtype
    presence = _row_values(md.presence_penalties, num_rows, 0.0, device, dtype)
    frequency = _row_values(md.frequency_penalties, num_rows, 0.0, device, dtype)
    repetition = _row_values(md.repetition_penalties, num_rows, 1.0, device, dtype)
    active = (presence != 0) | (frequency != 0) | (repetition != 1)
    rows = active.nonzero().flatten().tolist()
    if not rows:
        return logits
    full_batch = len(rows) == num_rows
    sub = logits if full_batch else logits[rows]
    index = None if full_batch else torch.tensor(rows, device=device)
    if index is not None:
        presence, frequency, repetition = presence[index], frequency[index], repetition[index]

    output_counts = _token_counts([md.output_token_ids[r] for r in rows], vocab, device, dtype)
    output_seen = output_counts > 0
    if bool((repetition != 1).any()):
        seen = output_seen | (
            _token_counts([md.prompt_token_ids[r] for r in rows], vocab, device, dtype) > 0
        )
        factor = torch.where(seen, repetition.unsqueeze(1), torch.ones_like(sub))
        sub.copy_(torch.where(sub > 0, sub / factor, sub * factor))
    sub -= frequency.unsqueeze(1) * output_counts
    sub -= presence.unsqueeze(1) * output_seen.to(dtype)
    if index is not None:
        logits[index] = sub
    return logits


def _token_counts(
    histories: list[list[int]], vocab: int, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """[len(histories), vocab] count of each token id per history.

    Ids >= vocab (e.g. multimodal prompt placeholders past the LM head) are
    counted in a spare column and dropped; negative ids raise.
    """
    width = vocab + 1
    counts = torch.zeros(len(histories), width, dtype=dtype, device=device)
    flat = torch.tensor(list(itertools.chain.from_iterable(histories)), dtype=torch.int64)
    if flat.numel() == 0:
        return counts[:, :vocab]
    if bool((flat < 0).any()):
        raise ValueError(
            "token history holds a negative id: a placeholder leaked into a list the "
            "sampler reads (DESIGN.md invariant 1)"
        )
    lengths = torch.tensor([len(h) for h in histories], dtype=torch.int64)
    rows = torch.repeat_interleave(torch.arange(len(histories)), lengths)
    # One scatter_add over the flattened [rows, vocab + 1] table; the spare
    # column `vocab` collects out-of-vocabulary ids and is dropped.
    flat_index = (rows * width + flat.clamp_(max=vocab)).to(device)
    counts.view(-1).scatter_add_(
        0, flat_index, torch.ones(flat_index.shape, dtype=dtype, device=device)
    )
    return counts[:, :vocab]


def _row_values(
    values: torch.Tensor | None,
    num_rows: int,
    default: float,
    device: torch.device,
    dtype: torch.dtype,
) -> torch.Tensor:
    if values is None:
        return torch.full((num_rows,), default, dtype=dtype, device=device)
    return values.to(device=device, dtype=dtype)


def _check_ids_in_vocab(what: str, ids: list[int], vocab: int) -> None:
    # The frontend should refuse these up front; this keeps a bad id from
    # writing into another row's logits or crashing with an index error.
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise ValueError(
            f"{what}: token ids {sorted(set(bad))} outside the vocabulary [0, {vocab})"
        )


def _tensor(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)
