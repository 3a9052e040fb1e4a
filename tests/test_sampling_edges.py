"""Edges of the sampling code that `make mutation` found untested (each test here killed
mutants that survived the rest of the suite): boundaries of the filters, the exact
messages of refused settings (they name the field), stage transitions and section
budgets at the start of a history, penalties given for one kind only, and the
repetition-aware redraw's temperature and batch."""

from __future__ import annotations

import re

import pytest
import torch

from omnistage.sample import RowSamplingState, Sampler, SamplingMetadata, row_seed
from omnistage.sample.logits_processors import (
    _token_counts,
    apply_logit_bias,
    apply_logits_processors,
    apply_min_tokens,
    apply_penalties,
)
from omnistage.sample.metadata import check_histories_current
from omnistage.sample.repetition_aware import RESAMPLE_SALT, RepetitionAwareSampler
from omnistage.sample.sampler import _apply_min_p, _apply_top_p
from omnistage.sample.stage_transitions import SectionBudget, StageTransitions
from omnistage.sampling_params import SamplingParams

VOCAB = {"<a>": 5, "<b>": 6, "<c>": 7}


def _exactly(message: str):
    return pytest.raises(ValueError, match=f"^{re.escape(message)}$")


# -- stage transitions and section budgets ---------------------------------------------------
def test_an_empty_trigger_or_forced_sequence_is_refused_by_name():
    for rules in ({(): (1,)}, {(1,): ()}):
        with _exactly("stage_transitions: trigger and forced sequences must be non-empty"):
            StageTransitions(rules)


@pytest.mark.parametrize(
    ("config", "budgets", "message"),
    [
        ({"<x>": "<a>"}, None, "stage_transitions: trigger token '<x>' is not in the vocabulary"),
        ({"<a>": "<x>"}, None, "stage_transitions: forced token '<x>' is not in the vocabulary"),
        (
            {},
            {"<x>": {"max_tokens": 2}},
            "stage_transitions: budget close token '<x>' is not in the vocabulary",
        ),
        (
            {},
            {"<a>": {"max_tokens": 2, "after": "<x>"}},
            "stage_transitions: budget after token '<x>' is not in the vocabulary",
        ),
        (
            {},
            {"<a>": {"max_tokens": 2, "open": "<b>"}},
            "stage_budgets['<a>']: expected {max_tokens: N, after: token (optional)}",
        ),
        (
            {},
            {"<a>": 3},
            "stage_budgets['<a>']: expected {max_tokens: N, after: token (optional)}",
        ),
        (
            {},
            {"<a>": {"max_tokens": -1}},
            "stage_budgets['<a>'].max_tokens: expected an integer >= 0, got -1",
        ),
        (
            {},
            {("<a>", "<b>"): {"max_tokens": 1}},
            "stage_budgets[('<a>', '<b>')]: the close token must be one token",
        ),
    ],
)
def test_stage_transition_configs_are_refused_naming_what_is_wrong(config, budgets, message):
    with _exactly(message):
        StageTransitions.from_config(config, VOCAB.get, budgets)


def test_a_budget_of_zero_tokens_closes_at_once():
    rules = StageTransitions.from_config({}, VOCAB.get, {"<a>": {"max_tokens": 0}})
    assert rules.forced_token([]) == VOCAB["<a>"]
    assert rules.forced_token([VOCAB["<a>"]]) is None


def test_a_section_opened_by_the_first_tokens_of_the_history_is_budgeted():
    budget = SectionBudget(close=7, max_tokens=2, after=5)
    assert budget.forced_token([5, 1]) is None
    assert budget.forced_token([5, 1, 2]) == 7  # the section opened at index 0
    assert budget.forced_token([1, 5, 1, 2]) == 7  # ... and at index 1
    assert budget.forced_token([5, 1, 7, 1, 2]) is None  # closed, nothing open


def test_a_budget_applies_after_a_trigger_too_long_for_the_history():
    rules = StageTransitions({(1, 2, 3, 4): (9,)}, [SectionBudget(close=7, max_tokens=2)])
    assert rules.forced_token([5, 6]) == 7


# -- filters and penalties ------------------------------------------------------------------
def test_min_p_of_one_keeps_the_most_likely_tokens():
    logits = torch.tensor([[1.0, 3.0, 3.0, -2.0]], dtype=torch.float64)
    _apply_min_p(logits, torch.tensor([1.0]))
    assert torch.isfinite(logits).tolist() == [[False, True, True, False]]


def test_a_single_token_of_history_is_counted():
    counts = _token_counts([[3]], vocab=5, device=torch.device("cpu"), dtype=torch.float64)
    assert counts.tolist() == [[0, 0, 0, 1, 0]]


def test_a_negative_id_in_a_history_is_refused_with_the_invariant():
    with _exactly(
        "token history holds a negative id: a placeholder leaked into a list the sampler "
        "reads (DESIGN.md invariant 1)"
    ):
        _token_counts([[3, -1]], vocab=5, device=torch.device("cpu"), dtype=torch.float64)


def test_one_kind_of_penalty_given_alone_applies_alone():
    """A metadata made by hand (a model's own sampler) may carry one penalty only."""
    row = RowSamplingState(SamplingParams(), seed=0, prompt_token_ids=[1], output_token_ids=[2])
    md = SamplingMetadata.from_requests([row], device="cpu")
    md.presence_penalties = torch.tensor([0.5])
    logits = torch.ones(1, 4, dtype=torch.float64)
    apply_penalties(logits, md)
    assert logits.tolist() == [[1.0, 1.0, 0.5, 1.0]]  # no repetition or frequency penalty


# -- repetition-aware sampling --------------------------------------------------------------
def test_ras_settings_are_checked_at_their_bounds():
    RepetitionAwareSampler(window=1, tau_r=1e-9)
    for window, tau_r in ((0, 0.1), (10, 0.0)):
        with _exactly(f"RAS: window >= 1 and tau_r > 0 needed, got {window}, {tau_r}"):
            RepetitionAwareSampler(window, tau_r)


def test_the_redraw_samples_each_row_at_its_temperature_in_float64():
    """Two rows redrawn at once, temperatures 0.5 and 2: each is the argmax of its
    softmax(logits / T) over Exp(1) draws of its second stream, computed in float64."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 32, generator=gen, dtype=torch.float64) * 3
    rows = [
        RowSamplingState(
            SamplingParams(temperature=t, top_k=1, seed=s),
            seed=s,
            prompt_token_ids=[1],
            output_token_ids=[],
        )
        for t, s in ((0.5, 11), (2.0, 12))
    ]
    # top_k=1 makes the first draw the argmax; seen once in the window, it is redrawn.
    for row, logit_row in zip(rows, logits, strict=True):
        row.output_token_ids.append(int(logit_row.argmax()))
    md = SamplingMetadata.from_requests(rows, device="cpu")
    got = RepetitionAwareSampler()(logits, md)
    expected = []
    for r, (temperature, seed) in enumerate(((0.5, 11), (2.0, 12))):
        probs = torch.softmax(logits[r : r + 1] / temperature, dim=-1)
        draws = Sampler.exponentials(probs, [(row_seed(seed, RESAMPLE_SALT), 1)])
        expected.append(int((probs / draws).argmax()))
    assert got.tolist() == expected
    assert expected != [int(row.argmax()) for row in logits]  # a redraw, not the argmax


def test_one_top_logprob_is_returned_beside_the_sampled_token():
    from omnistage.sample.sampler import gather_logprobs

    raw = torch.log_softmax(torch.tensor([[0.0, 2.0, 1.0]], dtype=torch.float64), dim=-1)
    got = gather_logprobs(raw, torch.tensor([2]), k=1)
    assert got.token_ids.tolist() == [[2, 1]]  # the sampled token, then the top one
    assert got.logprobs.tolist() == [[raw[0, 2].item(), raw[0, 1].item()]]
    assert got.ranks.tolist() == [2]


def test_a_logit_bias_on_the_id_one_past_the_vocabulary_is_refused():
    row = RowSamplingState(
        SamplingParams(logit_bias={4: 1.0}), seed=0, prompt_token_ids=[1], output_token_ids=[]
    )
    md = SamplingMetadata.from_requests([row], device="cpu")
    with _exactly("logit_bias: token ids [4] outside the vocabulary [0, 4)"):
        apply_logit_bias(torch.zeros(1, 4), md)


def test_logprobs_of_half_precision_logits_are_computed_in_float32():
    from omnistage.sample.sampler import compute_logprobs

    logits = torch.tensor([[0.0, 1.0, 2.0]], dtype=torch.bfloat16)
    got = compute_logprobs(logits)
    assert got.dtype == torch.float32
    assert torch.allclose(got, torch.log_softmax(logits.float(), dim=-1))


def test_a_budget_does_not_read_the_history_from_its_end():
    """No close yet and `after` only as the last token: the section just opened."""
    budget = SectionBudget(close=7, max_tokens=2, after=5)
    assert budget.forced_token([1, 2, 3, 5]) is None


def test_stage_transitions_may_be_given_as_ids():
    rules = StageTransitions.from_config({5: [6, 7]}, lambda text: None)
    assert rules.forced_token([1, 5]) == 6 and rules.forced_token([5, 6]) == 7


def test_a_forced_token_masked_before_is_still_the_one_sampled():
    """The forced token's logit was -inf (e.g. a logit_bias of -inf): it gets a finite one."""
    rules = StageTransitions({(5,): (6,)})
    logits = torch.zeros(1, 8)
    logits[0, 6] = float("-inf")
    rules.apply(logits, [[5]])
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [6]


def test_min_tokens_reaches_rows_after_one_without_it():
    rows = [
        RowSamplingState(SamplingParams(), seed=0, prompt_token_ids=[1], output_token_ids=[]),
        RowSamplingState(
            SamplingParams(min_tokens=2),
            seed=0,
            prompt_token_ids=[1],
            output_token_ids=[],
            eos_token_id=3,
        ),
    ]
    md = SamplingMetadata.from_requests(rows, device="cpu")
    logits = torch.zeros(2, 4)
    apply_min_tokens(logits, md)
    assert torch.isinf(logits).nonzero().tolist() == [[1, 3]]


def test_min_tokens_on_an_id_past_the_vocabulary_is_refused_by_name():
    row = RowSamplingState(
        SamplingParams(min_tokens=2),
        seed=0,
        prompt_token_ids=[1],
        output_token_ids=[],
        eos_token_id=9,
    )
    md = SamplingMetadata.from_requests([row], device="cpu")
    with _exactly("min_tokens: token ids [9] outside the vocabulary [0, 4)"):
        apply_min_tokens(torch.zeros(1, 4), md)


def test_a_logit_bias_is_added_in_the_logits_precision():
    row = RowSamplingState(
        SamplingParams(logit_bias={1: 0.1}), seed=0, prompt_token_ids=[1], output_token_ids=[]
    )
    md = SamplingMetadata.from_requests([row], device="cpu")
    logits = torch.zeros(1, 3, dtype=torch.float64)
    apply_logit_bias(logits, md)
    assert logits[0, 1].item() == 0.1  # not float32's 0.10000000149


def test_the_sampler_applies_penalties():
    row = RowSamplingState(
        SamplingParams(temperature=0.0, presence_penalty=0.5),
        seed=0,
        prompt_token_ids=[0],
        output_token_ids=[1],
    )
    md = SamplingMetadata.from_requests([row], device="cpu")
    logits = torch.tensor([[1.0, 1.2]])
    apply_logits_processors(logits, md)
    assert logits.tolist() == [[1.0, pytest.approx(0.7)]]


def test_a_top_p_of_one_keeps_tokens_float_rounding_would_drop():
    """softmax([0, -40]) is [1.0, 4e-18] in float64: a cumulative mass of 1.0 after the
    first token. A row with top_p 1 is left alone, not cut there."""
    logits = torch.tensor([[0.0, -40.0], [0.0, -40.0]], dtype=torch.float64)
    _apply_top_p(logits, torch.tensor([1.0, 0.5]))
    assert torch.isfinite(logits).tolist() == [[True, True], [True, False]]


def test_a_history_that_is_not_current_is_refused_with_the_invariant():
    row = RowSamplingState(
        SamplingParams(), seed=0, prompt_token_ids=[1], output_token_ids=[4], req_id="r"
    )
    message = (
        "sampling: request 'r' samples output 2 but its token history holds 1 tokens; the "
        "history must hold every token sampled before this step (DESIGN.md invariant 1)"
    )
    with pytest.raises(RuntimeError, match=f"^{re.escape(message)}$"):
        check_histories_current([row], [2])
    with pytest.raises(RuntimeError, match=r"^sampling: 2 output counts for 1 rows$"):
        check_histories_current([row], [1, 1])


# -- the sampler's own steps ----------------------------------------------------------------
def _splitmix64(seed: int, position: int) -> int:
    """row_seed's definition, written out: splitmix64 of seed * 1000003 + position, 63 bits."""
    mask = (1 << 64) - 1
    z = (seed * 1_000_003 + position + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


def test_row_seed_is_splitmix64_so_seeded_outputs_stay_the_same_across_versions():
    for seed, position in ((0, 0), (1, 0), (0, 1), (123, 7), (2**62, 2**20), (-5, 3)):
        assert row_seed(seed, position) == _splitmix64(seed, position)
    assert row_seed(0, 0) == 7070836379803831727  # pinned: a change reseeds every request


def _top_p_row(temperature: float, top_k: int, top_p: float, seed: int) -> RowSamplingState:
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    return RowSamplingState(params, seed=seed, prompt_token_ids=[1], output_token_ids=[])


def test_a_top_p_first_sampler_filters_top_p_before_top_k():
    """probs [0.5, 0.3, 0.2], top-p 0.6, top-k 2: top-p first keeps {0, 1} (then top-k keeps
    both); top-k first keeps {0, 1}, renormalized [0.625, 0.375], then top-p keeps {0}."""
    logits = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64).log()
    drawn = set()
    for seed in range(40):
        md = SamplingMetadata.from_requests([_top_p_row(1.0, 2, 0.6, seed)], device="cpu")
        drawn.add(int(Sampler(top_p_first=True)(logits.clone(), md)))
        assert int(Sampler()(logits.clone(), md)) == 0
    assert drawn == {0, 1}


def test_half_precision_logits_are_sampled_in_float32():
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(1, 64, generator=gen).to(torch.bfloat16)
    for seed in range(8):
        md = SamplingMetadata.from_requests([_top_p_row(0.7, 0, 1.0, seed)], device="cpu")
        probs = torch.softmax(logits.float() / 0.7, dim=-1)
        expected = int((probs / Sampler.exponentials(probs, [(seed, 0)])).argmax())
        assert int(Sampler()(logits, md)) == expected


def test_top_p_of_one_unsorted_row_past_the_fast_prefix():
    """One row whose nucleus is wider than the top-256 prefix, its logits in random order:
    the full sort decides (a single unresolved row)."""
    gen = torch.Generator().manual_seed(2)
    weights = torch.arange(1000, 0, -1, dtype=torch.float64)
    order = torch.randperm(1000, generator=gen)
    logits = weights.log()[order].unsqueeze(0)
    probs = torch.softmax(logits, dim=-1)[0]
    ranked = probs.sort(descending=True).values
    kept = 1 + int((ranked.cumsum(0)[:-1] < 0.9).sum())
    cut = logits.clone()
    _apply_top_p(cut, torch.tensor([0.9]))
    assert int(torch.isfinite(cut).sum()) == kept
    assert torch.isfinite(cut[0]).tolist() == (probs >= ranked[kept - 1]).tolist()


def test_top_p_keeps_nothing_past_an_exact_mass():
    """probs exactly [0.5, 0.25, 0.25] and top-p 0.5: the first token reaches the mass."""
    logits = torch.tensor([[2.0, 1.0, 1.0]], dtype=torch.float64).log()
    assert torch.softmax(logits, dim=-1).tolist() == [[0.5, 0.25, 0.25]]
    _apply_top_p(logits, torch.tensor([0.5]))
    assert torch.isfinite(logits).tolist() == [[True, False, False]]


def test_min_p_compares_in_the_logits_precision():
    """In float64, a logit just below max + log(min_p) is dropped (float32's log(0.5) would
    keep it)."""
    logits = torch.tensor([[0.0, -0.6931471815]], dtype=torch.float64)
    _apply_min_p(logits, torch.tensor([0.5]))
    assert torch.isfinite(logits).tolist() == [[True, False]]


def test_top_p_may_keep_every_token():
    logits = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64).log()
    _apply_top_p(logits, torch.tensor([0.9]))  # 0.5 + 0.3 < 0.9: the last one is needed
    assert torch.isfinite(logits).all()


def test_a_repetition_penalty_alone_divides_positive_and_multiplies_negative_seen_logits():
    row = RowSamplingState(
        SamplingParams(repetition_penalty=2.0), seed=0, prompt_token_ids=[0], output_token_ids=[1]
    )
    md = SamplingMetadata.from_requests([row])  # the default device: the CPU
    logits = torch.tensor([[-1.0, 3.0, 5.0]], dtype=torch.float64)
    apply_penalties(logits, md)
    assert logits.tolist() == [[-2.0, 1.5, 5.0]]  # prompt and output tokens are "seen"


def test_metadata_keeps_a_temperature_of_exactly_the_epsilon_and_the_rows_params():
    from omnistage.sample.metadata import SAMPLING_EPS

    params = [SamplingParams(temperature=SAMPLING_EPS), SamplingParams(temperature=0.0)]
    rows = [RowSamplingState(p, seed=0, prompt_token_ids=[1], output_token_ids=[]) for p in params]
    md = SamplingMetadata.from_requests(rows)
    assert float(md.temperature[0]) > 0 and float(md.temperature[1]) == 0.0
    assert not md.all_greedy and md.sampling_params == params


def test_a_temperature_of_exactly_the_epsilon_samples_a_tie_at_random():
    """A random row, however cold: between two equal logits it draws either (a greedy row
    would always take the lower id)."""
    from omnistage.sample.metadata import SAMPLING_EPS

    logits = torch.tensor([[1.0, 1.0, -5.0], [1.0, 1.0, -5.0]])
    drawn = set()
    for seed in range(16):  # beside a greedy row: the batch is neither all greedy nor random
        rows = [_top_p_row(SAMPLING_EPS, 0, 1.0, seed), _top_p_row(0.0, 0, 1.0, seed)]
        cold, greedy = Sampler()(logits.clone(), SamplingMetadata.from_requests(rows)).tolist()
        drawn.add(cold)
        assert greedy == 0
    assert drawn == {0, 1}


def test_a_frequency_penalty_alone_leaves_presence_at_zero():
    row = RowSamplingState(SamplingParams(), seed=0, prompt_token_ids=[0], output_token_ids=[2, 2])
    md = SamplingMetadata.from_requests([row])
    md.frequency_penalties = torch.tensor([0.25])
    logits = torch.ones(1, 3, dtype=torch.float64)
    apply_penalties(logits, md)
    assert logits.tolist() == [[1.0, 1.0, 0.5]]  # two occurrences, no presence penalty
