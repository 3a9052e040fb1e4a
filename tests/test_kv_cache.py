"""Block pool and KV cache manager: reference counts, prefix cache, check-then-commit."""

from __future__ import annotations

import pytest

from omnistage.core.block_pool import BlockPool
from omnistage.core.kv_cache_manager import KVCacheManager
from omnistage.core.request import Request
from omnistage.sampling_params import SamplingParams


def make_request(rid: str, tokens: list[int]) -> Request:
    return Request(
        rid, tokens, SamplingParams(max_tokens=8), eos_token_id=None, max_tokens=8, sample_seed=0
    )


def manager(num_blocks=9, block_size=4, caching=True) -> KVCacheManager:
    return KVCacheManager(num_blocks, block_size, max_model_len=64, enable_caching=caching)


def test_allocate_and_free_returns_every_block():
    kv = manager()
    req = make_request("a", list(range(10)))
    assert kv.can_allocate(req, 10)
    blocks = kv.allocate_slots(req, 10)
    assert len(blocks) == 3
    assert kv.num_free_blocks == 8 - 3
    kv.free(req)
    assert kv.num_free_blocks == 8
    assert kv.num_requests == 0


def test_can_allocate_says_no_when_full_and_allocate_then_raises():
    kv = manager(num_blocks=3)  # 2 usable blocks
    req = make_request("a", list(range(12)))
    assert not kv.can_allocate(req, 12)
    with pytest.raises(RuntimeError):
        kv.allocate_slots(req, 12)
    assert kv.num_free_blocks == 2


def test_prefix_cache_hit_shares_blocks_and_leaves_one_token():
    kv = manager()
    a = make_request("a", list(range(12)))
    kv.allocate_slots(a, 12)
    b = make_request("b", list(range(12)))
    assert (kv.prefix_queries, kv.prefix_hits) == (0, 0)
    hit, num = kv.get_computed_blocks(b)
    # 3 full blocks cached, but one token must be left to compute: 2 blocks hit.
    assert num == 8 and len(hit) == 2
    assert (kv.prefix_queries, kv.prefix_hits) == (12, 8)  # tokens asked for, tokens found
    kv.get_computed_blocks(make_request("c", list(range(10))))
    assert (kv.prefix_queries, kv.prefix_hits) == (22, 16)  # counted over every lookup
    assert hit.block_ids == kv.block_ids("a")[:2]
    kv.allocate_slots(b, 4, hit)
    assert kv.block_ids("b")[:2] == kv.block_ids("a")[:2]
    kv.free(a)
    kv.free(b)
    assert kv.num_free_blocks == 8


def test_hash_chain_distinguishes_prefixes():
    kv = manager()
    a = make_request("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    kv.allocate_slots(a, 9)
    b = make_request("b", [0, 2, 3, 4, 5, 6, 7, 8, 9])  # first block differs -> no hit at all
    assert kv.get_computed_blocks(b)[1] == 0
    c = make_request("c", [1, 2, 3, 4, 0, 6, 7, 8, 9])  # second block differs -> 1 block
    assert kv.get_computed_blocks(c)[1] == 4


def test_freed_cached_blocks_are_reused_then_evicted():
    kv = manager(num_blocks=5)  # 4 usable
    a = make_request("a", list(range(9)))
    kv.allocate_slots(a, 9)
    kv.free(a)
    b = make_request("b", list(range(9)))
    hit, num = kv.get_computed_blocks(b)
    assert num == 8
    # Reviving 2 cached free blocks counts against the free pool.
    assert kv.can_allocate(b, 1, hit)
    kv.allocate_slots(b, 1, hit)
    assert kv.num_free_blocks == 1
    kv.free(b)
    c = make_request("c", [100 + i for i in range(16)])
    kv.allocate_slots(c, 16)  # needs all 4: evicts the cached ones
    kv.free(c)
    assert kv.get_computed_blocks(make_request("d", list(range(9))))[1] == 0


def test_caching_off_never_hits():
    kv = manager(caching=False)
    a = make_request("a", list(range(12)))
    kv.allocate_slots(a, 12)
    assert kv.get_computed_blocks(make_request("b", list(range(12))))[1] == 0
    assert all(block.block_hash is None for block in kv.pool.blocks)  # nothing recorded


def test_the_pool_itself_records_nothing_with_caching_off_and_keeps_a_blocks_first_hash():
    off = BlockPool(4, enable_caching=False)
    block = off.take_new(1)[0]
    off.cache(block, b"h1")
    assert block.block_hash is None and off.lookup(b"h1") is None
    on = BlockPool(4, enable_caching=True)
    first, second = on.take_new(2)
    on.cache(first, b"h1")
    on.cache(first, b"h2")  # a block named once keeps its name
    on.cache(second, b"h1")  # an identical block is cached already: the first stays
    assert first.block_hash == b"h1" and on.lookup(b"h2") is None
    assert second.block_hash is None and on.lookup(b"h1") is first


def test_reset_prefix_cache_only_when_nothing_is_held_then_forgets_every_hash():
    kv = manager()
    a = make_request("a", list(range(12)))
    kv.allocate_slots(a, 12)
    assert not kv.reset_prefix_cache()  # a still holds its blocks
    kv.free(a)
    assert kv.get_computed_blocks(make_request("b", list(range(12))))[1] == 8  # still cached
    assert kv.reset_prefix_cache()
    assert all(block.block_hash is None for block in kv.pool.blocks)
    assert kv.get_computed_blocks(make_request("c", list(range(12))))[1] == 0


@pytest.mark.parametrize("caching", [True, False])
def test_covers_is_true_exactly_when_a_decode_needs_nothing_new(caching):
    """`covers` lets the scheduler skip `allocate_slots` on most decodes: true while the held
    blocks cover the new tokens and no block of known tokens fills up unhashed."""
    kv = manager(caching=caching)
    a = make_request("a", list(range(6)))
    assert not kv.covers(a, 6)  # holds nothing yet
    kv.allocate_slots(a, 6)  # 2 blocks of 4: 8 slots, the first block full
    a.num_computed_tokens = 6
    a.append_output_token(7)  # 7 tokens known
    assert kv.covers(a, 1) and kv.covers(a, 2)  # slots 7 and 8 are held
    assert not kv.covers(a, 3)  # a ninth slot needs a third block
    before = kv.block_ids("a")
    kv.allocate_slots(a, 2)  # what covers promised: nothing changes
    assert kv.block_ids("a") == before and kv.num_free_blocks == 6
    a.num_computed_tokens = 7
    a.append_output_token(8)  # 8 known: the second block is full
    assert kv.covers(a, 1) is (not caching)  # with caching it must be hashed first
    assert not kv.covers(make_request("b", [1]), 1)
    c = make_request("c", [1, 2, 3])
    kv.allocate_slots(c, 3)  # no block full: nothing hashed yet
    c.num_computed_tokens = 3
    c.append_output_token(4)  # its first block fills up
    assert kv.covers(c, 1) is (not caching)


def test_freeing_passes_over_the_null_block_and_frees_the_rest():
    pool = BlockPool(4, enable_caching=True)
    blocks = pool.take_new(2)
    pool.free([pool.null_block, *blocks])  # a padding slot's null block among them
    assert pool.num_free_blocks == 3 and pool.null_block.ref_cnt == 1


def test_freed_blocks_keep_cached_content_longest_and_a_double_free_is_named():
    """Unhashed blocks go to the front of the free queue, hashed ones to its tail: new
    blocks are taken from the front, so cached content is evicted last."""
    pool = BlockPool(5, enable_caching=True)
    cached, plain, other = pool.take_new(3)
    never_taken = pool.blocks[4]
    pool.cache(cached, b"h")
    pool.free([cached, plain])
    assert pool.take_new(2) == [plain, never_taken]
    assert pool.take_new(1) == [cached] and pool.lookup(b"h") is None  # evicted last
    pool.free([other])
    with pytest.raises(
        RuntimeError, match=f"KV block {other.block_id} freed more often than taken"
    ):
        pool.free([other])


def test_a_request_id_used_again_caches_its_new_blocks():
    """Freeing a request forgets how far its blocks were hashed: a later request with the
    same id and other tokens has its full blocks cached from the first."""
    kv = manager()
    kv.allocate_slots(make_request("a", list(range(8))), 8)
    kv.free(make_request("a", list(range(8))))
    again = make_request("a", list(range(100, 108)))
    kv.allocate_slots(again, 8)
    assert kv.get_computed_blocks(make_request("b", list(range(100, 109))))[1] == 8
    assert kv.block_ids("nobody") == [] and kv.num_blocks("nobody") == 0


def test_block_hashes_chain_over_the_prefix():
    kv = manager()
    a = make_request("a", [1, 2, 3, 4, 5, 6, 7, 8])
    b = make_request("b", [0, 2, 3, 4, 5, 6, 7, 8])  # block 1 equal, block 0 not
    for r in (a, b):
        kv.update_block_hashes(r)
    assert a.block_hashes[1] != b.block_hashes[1]  # equal hashes mean equal prefixes


def test_an_evicted_block_can_be_cached_again_and_too_large_asks_are_named():
    pool = BlockPool(3, enable_caching=True)
    first, second = pool.take_new(2)
    pool.cache(first, b"old")
    pool.free([first, second])
    assert set(pool.take_new(2)) == {first, second}  # the cached one evicted too
    pool.cache(first, b"new")
    assert pool.lookup(b"new") is first and pool.lookup(b"old") is None
    with pytest.raises(RuntimeError, match="asked for 2 KV blocks, 0 free"):
        pool.take_new(2)


def test_a_prompt_chunk_caches_only_the_blocks_it_computes():
    kv = manager()
    a = make_request("a", list(range(12)))
    kv.allocate_slots(a, 6)  # a first chunk: block 1 is held but half computed
    assert kv.get_computed_blocks(make_request("b", list(range(12))))[1] == 4


def test_blocks_after_prefix_hits_are_cached_and_revived_hits_count_against_free():
    kv = manager(num_blocks=7)  # 6 usable
    a = make_request("a", list(range(12)))
    kv.allocate_slots(a, 12)
    kv.free(a)  # 3 cached blocks, free again
    b = make_request("b", [*range(8), 100, 101, 102, 103, 104])
    hit, num = kv.get_computed_blocks(b)
    assert num == 8
    kv.allocate_slots(b, 5, hit)  # its own third block is full and known: cached
    c = make_request("c", [*range(8), 100, 101, 102, 103, 200])
    assert kv.get_computed_blocks(c)[1] == 12
    kv.free(b)
    big = make_request("big", [*range(8), *range(300, 320)])  # 2 hits + 5 new > 6 free
    hit, _ = kv.get_computed_blocks(big)
    assert not kv.can_allocate(big, 20, hit)
    with pytest.raises(RuntimeError, match="no KV blocks for request big"):
        kv.allocate_slots(big, 20, hit)


def test_a_pool_needs_the_null_block_and_one_more():
    assert BlockPool(2, enable_caching=True).num_free_blocks == 1
    with pytest.raises(ValueError, match="num_kv_blocks: need at least 2 KV blocks, got 1"):
        BlockPool(1, enable_caching=True)
