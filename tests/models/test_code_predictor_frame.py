"""A code predictor's frame in one C call (`DenseStep.frame`, `dense_frame_f32`): greedy rows
give the codes of the steps one by one (ties to the first, NaN counting as maximal);
sampled rows are the sampler's exponential race over the row's top-k, keyed as the
step-by-step metadata keys them, reproducible alone or batched, and distributed as the
softmax at the row's temperature; top-p or min-p rows keep the step-by-step path."""

from __future__ import annotations

import pytest
import torch

from omnistage import kernels
from omnistage.families.qwen3_omni.code_draws import code_predictor_metadata, frame_draws
from omnistage.layers.dense_step import FrameDraws
from omnistage.sample import SamplingMetadata
from omnistage.sample.metadata import RowSamplingState
from omnistage.sample.sampler import Sampler
from omnistage.sampling_params import SamplingParams
from tests.models.test_code_predictor_dense_step import _inputs, _predictor, _run

pytestmark = pytest.mark.skipif(kernels.load() is None, reason="no C compiler here")

CODES = 15
SAMPLED = SamplingParams(temperature=0.9, top_k=5)


def _metadata(
    params: list[SamplingParams],
    seeds: list[int],
    positions: list[int],
    code_params: SamplingParams = SAMPLED,
):
    rows = [
        RowSamplingState(sampling_params=p, seed=s, prompt_token_ids=[], output_token_ids=[])
        for p, s in zip(params, seeds, strict=True)
    ]
    md = SamplingMetadata.from_requests(rows, torch.device("cpu"))
    md.output_positions = positions
    return code_predictor_metadata(md, CODES, torch.device("cpu"), code_params)


def _frame(predictor, hidden, embeds, draws):
    fail = lambda j, lg: pytest.fail("a whole frame never calls sample")  # noqa: E731
    return predictor.generate(hidden, embeds, fail, whole_frame=draws)


@pytest.mark.parametrize(("talker_hidden", "bias"), [(48, False), (None, True)])
def test_a_greedy_frame_draws_the_codes_of_the_step_by_step_argmax(talker_hidden, bias):
    predictor = _predictor(torch.float32, talker_hidden, bias, seed=2)
    hidden, embeds = _inputs(6, talker_hidden or 32)
    greedy = FrameDraws.of([0.0] * 6, [0] * 6, [0] * 6, [0] * 6)
    assert torch.equal(
        _frame(predictor, hidden, embeds, greedy), _run(predictor, hidden, embeds)[0]
    )
    with torch.no_grad():  # ties go to the first maximal entry, NaN counts as maximal
        predictor.lm_head[2].weight.zero_()
        predictor.lm_head[5].weight[[9, 40]] = float("nan")
    codes = _frame(predictor, hidden, embeds, greedy)
    assert torch.equal(codes, _run(predictor, hidden, embeds)[0])
    assert (codes[:, 2] == 0).all() and (codes[:, 5] == 9).all()


def test_sampled_rows_are_the_race_over_their_top_k_keyed_as_step_by_step():
    predictor = _predictor(torch.float32, 48, False, seed=3)
    hidden, embeds = _inputs(8, 48)
    params = [SAMPLED, SamplingParams(temperature=0.0)] * 4
    seeds, positions = [11 * r + 5 for r in range(8)], [3 * r for r in range(8)]
    mds = _metadata(params, seeds, positions)
    draws = frame_draws(mds[0], positions)
    assert draws is not None
    codes = _frame(predictor, hidden, embeds, draws)
    # Replay the frame's codes step by step, keeping each code's logits.
    logits: list[torch.Tensor] = []

    def replay(j: int, lg: torch.Tensor) -> torch.Tensor:
        logits.append(lg.clone())
        return codes[:, j]

    assert torch.equal(predictor.generate(hidden, embeds, replay), codes)
    checked = 0
    for j, lg in enumerate(logits):
        md = mds[j]
        assert torch.equal(codes[1::2, j], lg[1::2].argmax(-1))  # the greedy rows
        for r in range(0, 8, 2):
            s = lg[r].double() / SAMPLED.temperature
            kept = s >= s.topk(SAMPLED.top_k).values[-1]
            assert kept[codes[r, j]]
            keys = [(md.seeds[r], md.output_positions[r])]
            q = Sampler.exponentials(lg[r : r + 1], keys)[0].double()
            quotient = torch.where(kept, (s - s.max()).exp() / q, torch.zeros_like(s))
            first, second = quotient.topk(2).values
            if first > second * (1 + 1e-5):  # not a near tie: the pick is certain
                assert codes[r, j] == quotient.argmax()
                checked += 1
    assert checked >= 50
    for r in (0, 3, 6):  # a row alone draws what it drew in the batch
        alone = _metadata(params[r : r + 1], seeds[r : r + 1], positions[r : r + 1])
        one = frame_draws(alone[0], positions[r : r + 1])
        assert torch.equal(
            _frame(predictor, hidden[r : r + 1], embeds[r : r + 1], one)[0], codes[r]
        )


def test_sampled_codes_follow_the_softmax_at_the_temperature():
    predictor = _predictor(torch.float32, None, False, seed=4)
    rows = 4000
    hidden, embeds = (t[:1].expand(rows, -1).contiguous() for t in _inputs(1, 32))
    draws = FrameDraws.of([0.7] * rows, [0] * rows, list(range(rows)), [7] * rows)
    codes = _frame(predictor, hidden, embeds, draws)[:, 0]
    logits = []
    predictor.generate(hidden[:1], embeds[:1], lambda j, lg: logits.append(lg) or lg.argmax(-1))
    expected = torch.softmax(logits[0][0].double() / 0.7, -1)
    seen = torch.bincount(codes, minlength=expected.numel()).double() / rows
    assert (seen - expected).abs().max() < 0.03  # ~4 standard errors at p = 0.25
    assert codes.unique().numel() > 10


def test_top_p_or_min_p_rows_keep_the_step_by_step_path():
    for params in (SamplingParams(temperature=0.9, top_p=0.8), SamplingParams(min_p=0.1)):
        mds = _metadata([SamplingParams(temperature=1.0)], [1], [0], code_params=params)
        assert frame_draws(mds[0], [0]) is None
    greedy = _metadata([SamplingParams(temperature=0.0)], [1], [0])
    assert frame_draws(greedy[0], [0]) is not None
