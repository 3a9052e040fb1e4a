"""Repetition-aware sampling (CosyVoice's `ras_sampling`, sample/repetition_aware.py).

- CosyVoice's nucleus (top-p of the whole distribution, then at most top-k) keeps
  exactly the tokens the reference's `nucleus_sampling` loop keeps.
- A drawn token not in the row's last 10 outputs is the nucleus draw; one that is gets
  redrawn from the whole distribution, on the row's second stream (seed, position).
- Rows sample the same alone or batched; greedy rows are untouched.
- The CosyVoice3 LM samples with it.
"""

from __future__ import annotations

import torch

from omnistage.sample import RowSamplingState, Sampler, SamplingMetadata, row_seed
from omnistage.sample.repetition_aware import RESAMPLE_SALT, RepetitionAwareSampler
from omnistage.sample.sampler import _apply_top_k_top_p
from omnistage.sampling_params import SamplingParams

V = 64


def _row(seed: int, history: list[int], temperature: float = 1.0) -> RowSamplingState:
    params = SamplingParams(temperature=temperature, top_k=25, top_p=0.8, seed=seed)
    return RowSamplingState(
        sampling_params=params, seed=seed, prompt_token_ids=[1], output_token_ids=history
    )


def _md(*rows: RowSamplingState) -> SamplingMetadata:
    return SamplingMetadata.from_requests(rows, device="cpu")


def _reference_nucleus(scores: torch.Tensor, top_p: float, top_k: int) -> set[int]:
    """The tokens CosyVoice's `nucleus_sampling` may draw (its loop, transcribed)."""
    kept, cum = [], 0.0
    values, ids = scores.softmax(dim=0).sort(descending=True, stable=True)
    for value, i in zip(values.tolist(), ids.tolist(), strict=True):
        if not (cum < top_p and len(kept) < top_k):
            break
        cum += value
        kept.append(i)
    return set(kept)


def test_the_nucleus_keeps_what_the_reference_keeps():
    gen = torch.Generator().manual_seed(0)
    for scale in (0.5, 2.0, 6.0):  # flat to peaked: top-p or top-k decides
        logits = torch.randn(8, 200, generator=gen, dtype=torch.float64) * scale
        masked = logits.clone()
        top_k, top_p = torch.full((8,), 25), torch.full((8,), 0.8, dtype=torch.float64)
        _apply_top_k_top_p(masked, top_k, top_p, top_p_first=True)
        for row in range(8):
            ours = set(torch.isfinite(masked[row]).nonzero().flatten().tolist())
            assert ours == _reference_nucleus(logits[row], 0.8, 25)


def test_a_new_token_is_the_nucleus_draw_and_a_repeat_is_redrawn_on_its_own_stream():
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(1))
    ras, nucleus = RepetitionAwareSampler(), Sampler(top_p_first=True)

    def others(token: int, n: int) -> list[int]:
        return [t for t in range(V) if t != token][:n]

    for seed in range(40):
        # a draw depends on (seed, output position = history length), not on the history
        drawn = int(nucleus(logits, _md(_row(seed, [0] * 10))))
        assert int(ras(logits, _md(_row(seed, others(drawn, 10))))) == drawn
        repeated = [drawn, *others(drawn, 9)]  # seen once in the last 10: tau_r 0.1 redraws
        probs = torch.softmax(logits.float(), dim=-1)
        keys = [(row_seed(seed, RESAMPLE_SALT), 10)]
        expected = int(probs.div(Sampler.exponentials(probs, keys)).argmax())
        assert int(ras(logits, _md(_row(seed, repeated)))) == expected
        # only the last 10 count: the same token 11 back is not a repeat
        drawn11 = int(nucleus(logits, _md(_row(seed, [0] * 11))))
        assert int(ras(logits, _md(_row(seed, [drawn11, *others(drawn11, 10)])))) == drawn11


def test_a_token_the_nucleus_always_picks_stops_looping():
    """The reference's reason for RAS: one dominant token (alone in the top-p nucleus)
    would be drawn forever; with it in the window, other tokens come out."""
    logits = torch.zeros(1, V)
    logits[0, 3] = 6.0  # p ~ 0.86: alone in the top-p 0.8 nucleus
    plain = Sampler(top_p_first=True)
    ras = RepetitionAwareSampler()
    outs = [int(ras(logits, _md(_row(seed, [3] * 10)))) for seed in range(200)]
    assert all(int(plain(logits, _md(_row(seed, [3] * 10)))) == 3 for seed in range(200))
    assert 5 < sum(t != 3 for t in outs) < 60  # redrawn from the whole: ~14 % elsewhere


def test_rows_sample_the_same_alone_and_batched_and_greedy_rows_are_untouched():
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(5, V, generator=gen)
    rows = [_row(s, list(range(s, s + 10))) for s in range(4)]
    rows.append(_row(9, [int(logits[4].argmax())] * 10, temperature=0.0))
    ras = RepetitionAwareSampler()
    batched = ras(logits, _md(*rows)).tolist()
    alone = [int(ras(logits[i : i + 1], _md(rows[i]))) for i in range(5)]
    assert batched == alone and batched[4] == int(logits[4].argmax())


def test_the_cosyvoice3_lm_samples_repetition_aware():
    from omnistage.families.cosyvoice3.model import CosyVoice3LM

    assert CosyVoice3LM.prefer_model_sampler and isinstance(
        CosyVoice3LM.ras, RepetitionAwareSampler
    )
    logits = torch.zeros(1, V)
    logits[0, 3] = 6.0
    lm = object.__new__(CosyVoice3LM)  # sampling needs no weights
    outs = [int(lm.sample(logits, _md(_row(seed, [3] * 10)))) for seed in range(50)]
    assert any(t != 3 for t in outs)
