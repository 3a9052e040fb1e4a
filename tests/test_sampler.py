"""Tests of the sampling pipeline: metadata, logits processors, sampler, logprobs."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from omnistage.sample import (
    RowSamplingState,
    Sampler,
    SamplingMetadata,
    apply_logit_bias,
    apply_logits_processors,
    apply_min_tokens,
    apply_penalties,
    compute_logprobs,
    gather_logprobs,
    row_seed,
)
from omnistage.sample.sampler import row_argmax
from omnistage.sampling_params import SamplingParams


def row(
    seed: int = 0,
    position: int | None = None,
    prompt: list[int] | None = None,
    output: list[int] | None = None,
    eos: int | None = None,
    req_id: str = "",
    **params: object,
) -> RowSamplingState:
    return RowSamplingState(
        sampling_params=SamplingParams(**params),
        seed=seed,
        prompt_token_ids=prompt or [],
        output_token_ids=output or [],
        eos_token_id=eos,
        output_position=position,
        req_id=req_id,
    )


def metadata(*rows: RowSamplingState) -> SamplingMetadata:
    return SamplingMetadata.from_requests(rows, device="cpu")


def sample_many(logits_row: torch.Tensor, n: int, seed: int = 7, **params: object) -> list[int]:
    """n draws of one row's distribution: the same row at output positions 0..n-1."""
    md = metadata(*(row(seed=seed, position=p, **params) for p in range(n)))
    return Sampler()(logits_row.expand(n, -1).clone(), md).tolist()


def probs_logits(probs: list[float]) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float32).log()


# ---------------------------------------------------------------- greedy


def test_all_greedy_is_argmax_with_lowest_id_on_ties() -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 40)
    logits[3, 5] = logits[3, 9] = logits[3].max() + 1.0  # a tie: id 5 must win
    md = metadata(*(row(temperature=0.0) for _ in range(6)))
    assert md.all_greedy
    out = Sampler()(logits, md)
    assert out.dtype == torch.int64
    assert torch.equal(out, logits.argmax(dim=-1))
    assert out[3].item() == 5


def test_greedy_rows_in_mixed_batch_stay_greedy() -> None:
    torch.manual_seed(1)
    logits = torch.randn(8, 50)
    temps = [0.0, 5.0, 0.0, 5.0, 5.0, 0.0, 5.0, 0.0]
    md = metadata(*(row(seed=i, temperature=t) for i, t in enumerate(temps)))
    assert not md.all_greedy and not md.all_random
    before = logits.clone()
    out = Sampler()(logits, md)
    assert torch.equal(logits, before), "the sampler must not modify its input"
    argmax = logits.argmax(dim=-1)
    for i, t in enumerate(temps):
        if t == 0.0:
            assert out[i] == argmax[i]
    # At temperature 5 over 50 tokens the random rows are not all at their argmax.
    assert any(out[i] != argmax[i] for i, t in enumerate(temps) if t > 0)


# ---------------------------------------------------------------- per-request randomness


def _target_rows() -> list[tuple[torch.Tensor, RowSamplingState]]:
    gen = torch.Generator().manual_seed(2)
    targets = []
    for i in range(12):
        logits = torch.randn(64, generator=gen) * 0.5
        extra: dict[str, object] = {}
        if i % 3 == 1:
            extra = {"top_k": 20, "top_p": 0.9}
        elif i % 3 == 2:
            extra = {"min_p": 0.05, "top_k": 30}
        targets.append((logits, row(seed=1000 + i, position=3 * i, temperature=1.5, **extra)))
    return targets


def test_seeded_row_gives_same_token_alone_or_in_any_batch() -> None:
    sampler = Sampler()
    gen = torch.Generator().manual_seed(3)
    for logits, target in _target_rows():
        alone = sampler(logits.unsqueeze(0).clone(), metadata(target)).item()
        for batch_size, index in [(2, 1), (16, 0), (16, 9), (16, 15), (5, 4)]:
            others = [
                row(seed=50 + j, temperature=[0.0, 0.8, 2.0][j % 3], top_k=j % 4)
                for j in range(batch_size - 1)
            ]
            rows = others[:index] + [target] + others[index:]
            batch = torch.randn(batch_size, 64, generator=gen)
            batch[index] = logits
            out = sampler(batch, metadata(*rows))
            assert out[index].item() == alone, (batch_size, index)
        # Recomputing the same position (e.g. after preemption) draws the same token.
        assert Sampler()(logits.unsqueeze(0).clone(), metadata(target)).item() == alone


def test_different_positions_and_seeds_draw_differently() -> None:
    flat = torch.zeros(1000)
    by_position = sample_many(flat, 200, seed=11)
    assert len(set(by_position)) > 150
    assert sample_many(flat, 200, seed=11) == by_position
    by_other_seed = sample_many(flat, 200, seed=12)
    assert sum(a != b for a, b in zip(by_position, by_other_seed, strict=True)) > 190
    md = metadata(*(row(seed=s, position=0) for s in range(200)))
    by_seed = Sampler()(flat.expand(200, -1).clone(), md).tolist()
    assert len(set(by_seed)) > 150


def test_row_seed_is_a_deterministic_63_bit_hash() -> None:
    values = {row_seed(s, p) for s in (-5, 0, 1, 2**62) for p in range(50)}
    assert len(values) == 200
    assert all(0 <= v < 2**63 for v in values)
    assert row_seed(7, 3) == row_seed(7, 3)


def _chi_square(counts: Counter, probs: torch.Tensor, n: int) -> float:
    return sum((counts[i] - n * p) ** 2 / (n * p) for i, p in enumerate(probs.tolist()))


def test_draws_follow_softmax_of_logits_over_temperature() -> None:
    logits = torch.tensor([1.0, 0.5, 0.0, -0.5, 2.0])
    n, temperature = 4000, 0.7
    counts = Counter(sample_many(logits, n, seed=123, temperature=temperature))
    expected = torch.softmax(logits / temperature, dim=-1)
    # 4 degrees of freedom: P(chi2 > 18.5) = 0.001.
    assert _chi_square(counts, expected, n) < 18.5
    # The test has power: the distribution without temperature is rejected.
    assert _chi_square(counts, torch.softmax(logits, dim=-1), n) > 100


def test_float64_logits_sample_in_float64() -> None:
    logits = torch.tensor([1.0, 0.5, 0.0, -0.5, 2.0], dtype=torch.float64)
    draws = sample_many(logits, 2000, seed=5)
    expected = torch.softmax(logits, dim=-1)
    assert _chi_square(Counter(draws), expected, 2000) < 18.5
    assert compute_logprobs(logits.unsqueeze(0)).dtype == torch.float64


# ---------------------------------------------------------------- top-k / top-p / min-p

PROBS = [0.5, 0.3, 0.1, 0.06, 0.04]


@pytest.mark.parametrize(
    ("params", "kept"),
    [
        ({"top_k": 2}, {0, 1}),
        ({"top_k": 0}, {0, 1, 2, 3, 4}),
        ({"top_k": -1}, {0, 1, 2, 3, 4}),
        ({"top_k": 99}, {0, 1, 2, 3, 4}),
        ({"top_p": 0.75}, {0, 1}),
        ({"top_p": 0.85}, {0, 1, 2}),
        ({"top_p": 1.0}, {0, 1, 2, 3, 4}),
        ({"top_p": 0.01}, {0}),
        ({"min_p": 0.15}, {0, 1, 2}),
        ({"min_p": 0.5}, {0, 1}),
        # top-k first, then top-p on the renormalised rest: 0.1 / 0.9 puts token 2 past 0.85.
        ({"top_k": 3, "top_p": 0.85}, {0, 1}),
        ({"top_k": 4, "min_p": 0.15}, {0, 1, 2}),
    ],
)
def test_filters_sample_exactly_the_kept_set(params: dict, kept: set[int]) -> None:
    draws = sample_many(probs_logits(PROBS), 1500, **params)
    assert set(draws) == kept


def test_filters_keep_ties_at_the_boundary() -> None:
    tied = torch.tensor([3.0, 2.0, 2.0, 1.0, 0.0])
    assert set(sample_many(tied, 600, top_k=2)) == {0, 1, 2}
    even = probs_logits([0.4, 0.3, 0.3])
    assert set(sample_many(even, 600, top_p=0.5)) == {0, 1, 2}


def test_top_p_with_a_nucleus_wider_than_the_fast_prefix() -> None:
    # p_i ~ (1000 - i): the 0.9 nucleus holds ~685 tokens, more than the top-256
    # prefix the fast path looks at, so these rows take the full-sort path.
    weights = torch.arange(1000, 0, -1, dtype=torch.float64)
    probs = weights / weights.sum()
    kept = 1 + int((probs.cumsum(0)[:-1] < 0.9).sum())
    assert 600 < kept < 700
    wide = probs.log().float()
    draws = sample_many(wide, 3000, top_p=0.9)
    assert 600 < max(draws) < kept
    # Interleaved with rows the fast path settles, every row draws as it would alone.
    peaked = torch.full((1000,), -10.0)
    peaked[:3] = torch.tensor([2.0, 1.5, 1.0])
    logits = torch.stack([wide if p % 2 else peaked for p in range(200)])
    md = metadata(*(row(seed=7, position=p, top_p=0.9) for p in range(200)))
    out = Sampler()(logits, md).tolist()
    assert out[1::2] == draws[1:200:2]
    assert set(out[0::2]) <= {0, 1, 2}


@pytest.mark.parametrize("narrow", [{"top_k": 1}, {"top_p": 0.01}, {"min_p": 0.9}])
def test_filters_are_per_row(narrow: dict) -> None:
    logits = probs_logits(PROBS).expand(400, -1).clone()
    # Alternate narrowed rows with unfiltered ones: only the narrowed rows lose tokens.
    md = metadata(*(row(seed=1, position=p, **(narrow if p % 2 else {})) for p in range(400)))
    out = Sampler()(logits, md)
    assert set(out[1::2].tolist()) == {0}
    assert set(out[0::2].tolist()) == {0, 1, 2, 3, 4}


# ---------------------------------------------------------------- logits processors


def _reference_penalties(
    logits: torch.Tensor, prompt: list[int], output: list[int], pres: float, freq: float, rep: float
) -> torch.Tensor:
    out = logits.clone()
    for token in (set(prompt) | set(output)) & set(range(len(logits))):
        out[token] = out[token] / rep if out[token] > 0 else out[token] * rep
    for token, count in Counter(output).items():
        out[token] -= freq * count + pres
    return out


def test_penalties_match_per_row_reference() -> None:
    torch.manual_seed(4)
    vocab = 30
    cases = [
        # prompt, output, presence, frequency, repetition
        ([1, 2, 3, 3], [4, 4, 4, 5, 1], 0.5, 0.3, 1.3),
        ([7, 8], [8, 9, 9], 0.0, 0.0, 1.0),  # no penalty: row untouched
        ([10, 11, 29], [], 1.0, 1.0, 0.7),  # repetition < 1 boosts; no output
        ([], [12, 12, 13, 12], -0.5, 0.8, 1.0),
        ([0, 35], [6, 6], 0.0, 0.0, 2.0),  # 35 is past the vocab: ignored
    ]
    logits = torch.randn(len(cases), vocab) * 3
    md = metadata(
        *(
            row(
                prompt=p,
                output=o,
                presence_penalty=pr,
                frequency_penalty=fr,
                repetition_penalty=rp,
            )
            for p, o, pr, fr, rp in cases
        )
    )
    expected = torch.stack([_reference_penalties(logits[i], *case) for i, case in enumerate(cases)])
    out = apply_penalties(logits.clone(), md)
    torch.testing.assert_close(out, expected)
    assert torch.equal(out[1], logits[1])


def test_no_penalty_means_no_work_and_no_change() -> None:
    md = metadata(row(prompt=[1, 2], output=[2, 2]), row(output=[3]))
    assert md.presence_penalties is None and md.repetition_penalties is None
    logits = torch.randn(2, 10)
    before = logits.clone()
    assert apply_logits_processors(logits, md) is logits
    assert torch.equal(logits, before)


def test_placeholder_in_history_is_refused() -> None:
    md = metadata(row(output=[3, -1], frequency_penalty=1.0))
    with pytest.raises(ValueError, match="placeholder"):
        apply_penalties(torch.zeros(1, 10), md)


def test_logit_bias_adds_to_listed_tokens_only() -> None:
    logits = torch.zeros(3, 10)
    md = metadata(row(logit_bias={3: 5.0, 7: -2.5}), row(), row(logit_bias={0: 100.0}))
    apply_logit_bias(logits, md)
    expected = torch.zeros(3, 10)
    expected[0, 3], expected[0, 7], expected[2, 0] = 5.0, -2.5, 100.0
    assert torch.equal(logits, expected)
    with pytest.raises(ValueError, match="logit_bias"):
        apply_logit_bias(torch.zeros(1, 5), metadata(row(logit_bias={9: 1.0})))


def test_min_tokens_masks_eos_and_stop_ids_until_reached() -> None:
    eos, stop = 2, 5

    def masked(output: list[int], **params: object) -> set[int]:
        logits = torch.zeros(1, 8)
        md = metadata(row(output=output, eos=eos, min_tokens=3, stop_token_ids=[stop], **params))
        apply_min_tokens(logits, md)
        return set(torch.isinf(logits[0]).nonzero().flatten().tolist())

    assert masked([]) == {eos, stop}
    assert masked([1, 1]) == {eos, stop}
    assert masked([1, 1, 1]) == set()
    assert masked([1], ignore_eos=True) == {stop}
    # A hand-built entry is checked against the current history length too.
    md = metadata(row())
    md.min_tokens = [(2, [eos])]
    md.output_token_ids = [[1, 1]]
    logits = torch.zeros(1, 8)
    assert torch.equal(apply_min_tokens(logits, md), torch.zeros(1, 8))
    # End to end: greedy would pick EOS, but not before min_tokens.
    logits = torch.zeros(1, 8)
    logits[0, eos] = 10.0
    md = metadata(row(output=[1], eos=eos, min_tokens=2, temperature=0.0))
    assert Sampler()(apply_logits_processors(logits, md), md).item() != eos


# ---------------------------------------------------------------- logprobs


def test_logprobs_are_raw_with_sampled_token_first_and_ranks() -> None:
    torch.manual_seed(5)
    raw = torch.randn(4, 20)
    raw[2, 4] = raw[2, 6] = 9.0  # tie for first place
    md = metadata(
        row(seed=1, logprobs=3, temperature=0.0, logit_bias={0: 50.0}),
        row(seed=2, logprobs=1, temperature=1.0),
        row(seed=3, temperature=0.0, logit_bias={6: 1.0}),
        row(seed=4, logprobs=0, temperature=1.0, top_k=3),
    )
    assert md.max_num_logprobs == 3
    logits = raw.clone()
    raw_logprobs = compute_logprobs(logits, md)
    sampled = Sampler()(apply_logits_processors(logits, md), md)
    assert sampled[0].item() == 0 and sampled[2].item() == 6
    result = gather_logprobs(raw_logprobs, sampled, md.max_num_logprobs)
    reference = torch.log_softmax(raw, dim=-1)
    assert result.token_ids.shape == (4, 4) and result.logprobs.shape == (4, 4)
    assert torch.equal(result.token_ids[:, 0], sampled)
    for i in range(4):
        ids = result.token_ids[i]
        torch.testing.assert_close(result.logprobs[i], reference[i, ids])
        assert torch.equal(ids[1:], reference[i].topk(3).indices)
        expected_rank = 1 + int((reference[i] > reference[i, sampled[i]]).sum())
        assert result.ranks[i].item() == expected_rank
    assert result.ranks[2].item() == 1  # tied for first: nothing strictly greater
    only_sampled = gather_logprobs(raw_logprobs, sampled, 0)
    assert only_sampled.token_ids.shape == (4, 1)


# ---------------------------------------------------------------- metadata


def test_from_requests_leaves_unused_features_off() -> None:
    md = metadata(row(temperature=0.0, top_k=5, top_p=0.5, min_p=0.2), row(top_k=-1))
    assert md.top_k is None and md.top_p is None and md.min_p is None
    assert md.presence_penalties is None and md.max_num_logprobs is None
    assert md.logit_bias == [None, None] and md.min_tokens == [None, None]
    md = metadata(
        row(temperature=1e-7), row(seed=9, output=[1, 2], top_k=4, repetition_penalty=1.2)
    )
    assert md.temperature.tolist() == [0.0, 1.0]
    assert md.top_k.tolist() == [0, 4]
    assert md.repetition_penalties.tolist() == pytest.approx([1.0, 1.2])
    assert md.frequency_penalties.tolist() == [0.0, 0.0]
    assert md.seeds == [0, 9] and md.output_positions == [0, 2]


def test_a_history_behind_the_step_positions_is_refused() -> None:
    """The runner's count of outputs before each sampled token (from the step's positions)
    must equal the history's length: one token behind, or ahead, raises (issue 26)."""
    rows = [row(output=[4, 5], req_id="a"), row(output=[], req_id="b")]
    assert metadata(*rows).output_positions == [2, 0]
    assert SamplingMetadata.from_requests(rows, "cpu", [2, 0]).output_positions == [2, 0]
    for wrong in ([3, 0], [2, 1], [1, 0]):
        with pytest.raises(RuntimeError, match="history holds"):
            SamplingMetadata.from_requests(rows, "cpu", wrong)


def test_empty_batch() -> None:
    md = metadata()
    assert Sampler()(torch.zeros(0, 10), md).shape == (0,)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_row_argmax_is_torchs_argmax(dtype):
    """The numpy-backed argmax of the greedy and random paths picks what `argmax(dim=-1)`
    picks: the first of tied maxima, a NaN as the maximum, strided rows, one row or many."""
    g = torch.Generator().manual_seed(0)
    wide = torch.randn(3, 49152, generator=g).to(dtype)
    wide[0, 40000] = wide[0, 7] = wide[0].max() + 1  # a tie: the first wins
    wide[1, 11] = float("nan")
    cases = [wide, wide[:, ::3], wide[2], torch.zeros(2, 9, dtype=dtype)]
    for x in cases:
        got, want = row_argmax(x), x.argmax(dim=-1)
        assert got.dtype == torch.int64 and torch.equal(got, want)
    assert row_argmax(wide)[:2].tolist() == [7, 11]
