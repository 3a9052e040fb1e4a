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


def _with_codes(prompt_len: int, codes: list[list[int]], num_outputs: int = 8) -> Request:
    r = Request("r", list(range(1, prompt_len + 1)), SamplingParams(max_tokens=64), None, 64, 0)
    r.output_token_ids = [9] * num_outputs
    r.output_codes = codes
    return r


def test_each_output_positions_codes_count_in_the_block_that_holds_it():
    """However the prompt ends inside a block, the first output's codes go into the hash of
    the block holding it, and a block of prompt tokens only is hashed from its tokens alone
    (so a request's prompt blocks match a new request's)."""
    manager = KVCacheManager(16, 4, max_model_len=64, enable_caching=True)
    codes = [[k, k] for k in range(8)]
    for prompt_len in (2, 3, 4):
        a = _with_codes(prompt_len, codes)
        b = _with_codes(prompt_len, [[99, 0], *codes[1:]])  # only the first output's differ
        plain = _with_codes(prompt_len, [])
        for r in (a, b, plain):
            manager.update_block_hashes(r)
        holding = prompt_len // 4  # the block of position prompt_len, the first output
        assert len(a.block_hashes) == (prompt_len + 8) // 4  # full blocks only
        assert a.block_hashes[:holding] == plain.block_hashes[:holding]
        assert a.block_hashes[holding] != b.block_hashes[holding], prompt_len


def test_codes_of_late_blocks_are_sliced_by_position():
    manager = KVCacheManager(16, 4, max_model_len=64, enable_caching=True)
    codes = [[k] for k in range(40)]
    a = _with_codes(1, codes, num_outputs=40)
    b = _with_codes(1, [*codes[:30], [-5], *codes[31:]], num_outputs=40)  # output 30 differs
    for r in (a, b):
        manager.update_block_hashes(r)
    assert len(a.block_hashes) == 10
    assert a.block_hashes[:7] == b.block_hashes[:7]  # position 31 is in block 7
    assert a.block_hashes[7] != b.block_hashes[7]
