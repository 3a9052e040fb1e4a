"""`accepted_counts` on its own: how many leading drafts of each row the target confirms.

Written against the mutants `make mutation` found alive in `spec_decode/verify.py`
(docs/testing.md lists those that are equivalent).
"""

from __future__ import annotations

import torch

from omnistage.spec_decode.verify import accepted_counts


def test_leading_matches_count_until_the_first_mismatch_per_row():
    # Row 0: drafts [5, 6, 7], target 5 6 9 | bonus 1 -> 2 accepted.
    # Row 1: no drafts, bonus only -> 0.  Row 2: drafts [8, 8], target 8 8 | bonus 3 -> 2.
    # Row 3: drafts [4], target 2 | bonus -> 0 (a later match does not count).
    target = torch.tensor([5, 6, 9, 1, 0, 8, 8, 3, 2, 4])
    counts = accepted_counts(target, [[5, 6, 7], [], [8, 8], [4]])
    assert counts.dtype == torch.int64
    assert counts.tolist() == [2, 0, 2, 0]


def test_a_match_after_a_mismatch_is_not_accepted():
    target = torch.tensor([1, 9, 3, 0])
    assert accepted_counts(target, [[1, 2, 3]]).tolist() == [1]


def test_rows_without_drafts_accept_nothing_and_no_rows_give_an_empty_count():
    counts = accepted_counts(torch.tensor([7, 7]), [[], []])
    assert counts.dtype == torch.int64 and counts.tolist() == [0, 0]
    none = accepted_counts(torch.tensor([], dtype=torch.int64), [])
    assert none.dtype == torch.int64 and none.shape == (0,)
