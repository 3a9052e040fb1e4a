"""Prefix caching for models that sample codes with each token (a speech LM's codebooks):
a position's input is its token and its codes, so equal tokens with other codes are
another prefix (else a recomputed request could take a block computed from another
request's codes, e.g. two MiMo-Audio requests at `<|empty|>` positions)."""

from __future__ import annotations

from omnistage.core.kv_cache_manager import KVCacheManager
from omnistage.core.request import Request
from omnistage.sampling_params import SamplingParams


def request(rid: str, codes: list[list[int]]) -> Request:
    r = Request(rid, [1, 2, 3, 4, 5, 6], SamplingParams(max_tokens=8), None, 8, 0)
    r.output_token_ids = [9] * len(codes)
    r.output_codes = codes
    return r


def test_block_hashes_cover_the_codes_of_output_positions():
    manager = KVCacheManager(8, 4, max_model_len=64, enable_caching=True)
    a = request("a", [[1, 1], [2, 2], [3, 3], [4, 4], [5, 5], [6, 6]])
    b = request("b", [[1, 1], [2, 2], [3, 3], [4, 4], [5, 5], [0, 6]])
    c = request("c", [[1, 1], [2, 2], [3, 3], [4, 4], [5, 5], [6, 6]])
    for r in (a, b, c):
        manager.update_block_hashes(r)
    assert len(a.block_hashes) == 3
    assert a.block_hashes[:2] == b.block_hashes[:2]  # prompt block, then equal codes
    assert a.block_hashes[2] != b.block_hashes[2]  # the last position's codes differ
    assert a.block_hashes == c.block_hashes
    plain = Request("p", [1, 2, 3, 4, 5, 6], SamplingParams(max_tokens=8), None, 8, 0)
    plain.output_token_ids = [9] * 6
    manager.update_block_hashes(plain)
    assert plain.block_hashes[0] == a.block_hashes[0]  # a prompt-only block: tokens alone
    assert plain.block_hashes[1] != a.block_hashes[1]
