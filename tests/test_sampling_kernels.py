"""The sampler's C paths (`kernels/sample_race.c`): the exponential race's counter-based
draws and the top-k filter compute what their torch paths compute."""

from __future__ import annotations

import pytest
import torch

from omnistage import kernels
from omnistage.sample import sampler as S

needs_kernels = pytest.mark.skipif(kernels.load() is None, reason="no C compiler here")
"""For the tests comparing a C path with its torch path."""


@pytest.fixture
def torch_only(monkeypatch):
    """Run the block on the torch paths."""

    def use_torch() -> None:
        monkeypatch.setattr(kernels, "load", lambda: None)

    return use_torch


@needs_kernels
def test_race_draws_in_c_are_the_torch_draws(torch_only):
    keys = [S.row_seed(seed, position) for seed in (0, 1, 2**62) for position in (0, 7)]
    in_c = S.race_draws(keys, 3000)
    torch_only()
    in_torch = S.race_draws(keys, 3000)
    # the same uniform draws; the logs agree to float32 rounding
    torch.testing.assert_close(in_c, in_torch, rtol=2.5e-7, atol=0)
    assert (in_c == in_torch).float().mean() > 0.9


@pytest.mark.parametrize("on_torch", [False, True])
def test_race_draws_are_exp1_per_token_and_key_alone(torch_only, on_torch):
    if on_torch:
        torch_only()
    keys = [S.row_seed(5, position) for position in range(64)]
    q = S.race_draws(keys, 4096)
    assert q.dtype == torch.float32 and bool((q > 0).all()) and bool(q.isfinite().all())
    # Exp(1): mean 1, variance 1, P(q > 1) = 1/e (262144 draws: a few thousandths off)
    assert abs(q.mean().item() - 1) < 0.01 and abs(q.var().item() - 1) < 0.02
    assert abs((q > 1).float().mean().item() - 0.36788) < 0.005
    # a pure function of (key, token): another batch, a shorter vocabulary, the same draws
    assert torch.equal(S.race_draws(keys[3:4], 100)[0], q[3, :100])
    assert not torch.equal(q[0], q[1])


def _on_torch(apply, c_path: str, logits: torch.Tensor, arg: torch.Tensor, monkeypatch):
    """`apply(a copy of logits, arg)` with `sampler.py`'s C path `c_path` ruled out."""
    out = logits.clone()
    with monkeypatch.context() as patch:
        patch.setattr(S, c_path, lambda *args, **kwargs: None)
        apply(out, arg)
    return out


def _torch_top_k(logits: torch.Tensor, k: torch.Tensor, monkeypatch) -> torch.Tensor:
    return _on_torch(S._apply_top_k, "_top_k_in_c", logits, k, monkeypatch)


@needs_kernels
def test_top_k_in_c_is_the_torch_filter(monkeypatch):
    g = torch.Generator().manual_seed(0)
    for case in range(150):
        rows = int(torch.randint(1, 20, (1,), generator=g))
        vocab = int(torch.randint(2, 300, (1,), generator=g))
        logits = torch.randn(rows, vocab, generator=g)
        if case % 3 == 0:
            logits = torch.round(logits * 2) / 2  # ties at the boundary
        if case % 5 == 0:
            logits[:, ::7] = float("-inf")  # masked tokens
        k = torch.randint(-1, vocab + 2, (rows,), generator=g)  # also 0, vocab and beyond
        ours = logits.clone()
        S._apply_top_k(ours, k)
        assert torch.equal(ours, _torch_top_k(logits, k, monkeypatch)), case


def test_top_k_of_a_row_with_nan_takes_the_torch_path(monkeypatch):
    logits = torch.randn(3, 10, generator=torch.Generator().manual_seed(1))
    logits[1, 4] = float("nan")
    k = torch.tensor([3, 3, 3])
    ours = logits.clone()
    S._apply_top_k(ours, k)
    expected = _torch_top_k(logits, k, monkeypatch)
    assert torch.equal(ours.isnan(), expected.isnan())
    assert torch.equal(ours.nan_to_num(), expected.nan_to_num())


def _torch_top_p(logits: torch.Tensor, p: torch.Tensor, monkeypatch) -> torch.Tensor:
    return _on_torch(S._apply_top_p, "_top_p_cutoff_in_c", logits, p, monkeypatch)


@needs_kernels
def test_top_p_cutoff_in_c_is_the_torch_cutoff(monkeypatch):
    """The same kept tokens as torch's topk + cumsum, on rows with ties, masked tokens,
    nuclei wider than the fast prefix and rows whose probabilities are NaN (all masked)."""
    g = torch.Generator().manual_seed(2)
    for case in range(200):
        rows = int(torch.randint(1, 12, (1,), generator=g))
        vocab = int(torch.randint(2, 700, (1,), generator=g))
        scale = float(torch.rand(1, generator=g) * 8)
        logits = torch.randn(rows, vocab, generator=g) * scale
        if case % 3 == 0:
            logits = torch.round(logits * 2) / 2
        if case % 5 == 0:
            logits[:, ::3] = float("-inf")
        if case % 7 == 0:
            logits[0] = float("-inf")
        p = torch.rand(rows, generator=g)
        if case % 2:
            p[::4] = 1.0  # rows left alone among filtered ones
        ours = logits.clone()
        S._apply_top_p(ours, p)
        expected = _torch_top_p(logits, p, monkeypatch)
        assert torch.equal(ours.isnan(), expected.isnan()), case
        assert torch.equal(ours.nan_to_num(), expected.nan_to_num()), case


@needs_kernels
def test_a_wide_nucleus_gets_the_cutoff_of_the_full_sort(monkeypatch):
    """Nuclei past the first 256 tokens: within the 4096 largest (C) or past them (the full
    sort), the same kept tokens as the torch path."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 6000, generator=g) * torch.tensor(
        [[0.5], [1.0], [2.0], [0.1], [3], [0]]
    )
    p = torch.tensor([0.9, 0.95, 0.6, 0.99, 0.97, 0.5])
    ours = logits.clone()
    S._apply_top_p(ours, p)
    kept = (ours > float("-inf")).sum(dim=1)
    assert bool(((kept > 256) & (kept <= 4096)).any()) and bool((kept > 4096).any())
    assert torch.equal(ours, _torch_top_p(logits, p, monkeypatch))


def test_race_draws_are_the_same_floats_on_every_build():
    """The log is written with explicit FMAs: the AVX-512 build and one without it (what an
    AVX2-only CPU runs) draw the same floats, so sampled tokens do not depend on the CPU."""
    native, generic = kernels.load(), kernels.load_variant(("-mno-avx512f",))
    if native is None or generic is None:
        pytest.skip("no C compiler on this machine")
    keys = torch.tensor([S.row_seed(s, 3) for s in range(8)], dtype=torch.int64)
    draws = []
    for lib in (native, generic):
        q = torch.empty(8, 5000)
        lib.race_exponentials_f32(keys.data_ptr(), 8, 5000, q.data_ptr(), 1)
        draws.append(q)
    assert torch.equal(draws[0], draws[1])


@needs_kernels
def test_the_race_pick_in_c_is_the_argmax_of_probs_over_the_draws():
    # `race_pick_f32` draws only tokens of nonzero probability; the pick must be the torch
    # path's argmax of probs / q all the same: ties, NaN (the first wins), rows of zeros,
    # quotients that underflow, vocabularies off the kernel's blocks of 64.
    g = torch.Generator().manual_seed(3)
    for case in range(150):
        rows, vocab = 1 + case % 7, (1, 7, 63, 64, 65, 130, 2048)[case % 7]
        logits = torch.randn(rows, vocab, generator=g) * (0.1, 1.0, 5.0, 30.0)[case % 4]
        k = (1, 5, 50, 0)[case % 4]
        if 0 < k < vocab:
            kth = logits.topk(k, -1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, -1)
        if case % 5 == 0:
            probs[0, vocab // 2] = float("nan")
        if case % 6 == 0:
            probs[-1] = 0.0
        if case % 8 == 0 and vocab > 3:
            probs[0, 1] = 1e-44
        keys = [(case * 31 + r, case) for r in range(rows)]
        expected = S.row_argmax(probs.clone().div_(S.Sampler.exponentials(probs, keys)))
        assert torch.equal(S.Sampler.race(probs.clone(), keys), expected), case


@needs_kernels
def test_top_k_over_a_large_vocabulary_with_ties_is_the_torch_filter(monkeypatch):
    # Past k blocks of 16 values the C top-k takes only the values at or above the k-th
    # largest block maximum to its heap: with ties around that floor and masked tokens.
    g = torch.Generator().manual_seed(1)
    for case in range(20):
        logits = torch.round(torch.randn(6, 5000, generator=g) * (1, 4)[case % 2]) / 2
        logits[:, case::9] = float("-inf")
        k = torch.tensor([1, 2, 16, 50, 300, 312])
        ours = logits.clone()
        S._apply_top_k(ours, k)
        assert torch.equal(ours, _torch_top_k(logits, k, monkeypatch)), case
