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
from omnistage.sample.logits_processors import _token_counts, apply_logit_bias, apply_penalties
from omnistage.sample.repetition_aware import RESAMPLE_SALT, RepetitionAwareSampler
from omnistage.sample.sampler import _apply_min_p
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
    logits = torch.zeros(1, 4, dtype=torch.float64)
    apply_penalties(logits, md)
    assert logits.tolist() == [[0.0, 0.0, -0.5, 0.0]]


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
