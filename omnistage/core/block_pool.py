"""`BlockPool`: the fixed set of KV cache blocks, their reference counts and the prefix cache.

A block is free when no request holds it (`ref_cnt == 0`). Free blocks wait in
an LRU queue; a free block may still carry the hash of the full block of
tokens it caches, so a later request with the same prefix can take it back
(`touch`) instead of recomputing. A block is evicted from the prefix cache
only when it is handed out again for new tokens.

Block 0 is never handed out: it is the null block that padding slots point to.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

BlockHash = bytes


def hash_block_tokens(parent: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    """Hash of a full block: chained over the parent's hash, so equal hashes mean equal prefixes."""
    h = hashlib.blake2b(digest_size=16)
    if parent is not None:
        h.update(parent)
    h.update(b",".join(str(t).encode() for t in token_ids))
    return h.digest()


@dataclass(eq=False)
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None


class BlockPool:
    """Owns every block; hands them out, takes them back, and keeps the prefix-cache index."""

    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_kv_blocks: need at least 2 KV blocks, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.null_block = self.blocks[0]
        self.null_block.ref_cnt = 1
        # LRU order: the first entry is evicted first.
        self._free: OrderedDict[int, KVCacheBlock] = OrderedDict(
            (b.block_id, b) for b in self.blocks[1:]
        )
        self._cached: dict[BlockHash, KVCacheBlock] = {}

    # -- queries ---------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_usable_blocks

    def lookup(self, block_hash: BlockHash) -> KVCacheBlock | None:
        return self._cached.get(block_hash)

    # -- transitions -------------------------------------------------------------
    def take_new(self, n: int) -> list[KVCacheBlock]:
        """Hand out n blocks for new tokens, evicting their old cache entries."""
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} KV blocks, {len(self._free)} free (check first)")
        out = []
        for _ in range(n):
            _, block = self._free.popitem(last=False)
            self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on cached blocks a request reuses."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def free(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference on each block; blocks nobody holds go to the tail of the LRU queue.

        Callers pass a request's blocks in reverse order so that its tail blocks
        (the least likely to be shared) are evicted first.
        """
        for block in blocks:
            if block is self.null_block:
                continue
            block.ref_cnt -= 1
            if block.ref_cnt < 0:
                raise RuntimeError(f"KV block {block.block_id} freed more often than taken")
            if block.ref_cnt == 0:
                if block.block_hash is None:
                    # Uncached blocks are the best to reuse: put them first.
                    self._free[block.block_id] = block
                    self._free.move_to_end(block.block_id, last=False)
                else:
                    self._free[block.block_id] = block

    def cache(self, block: KVCacheBlock, block_hash: BlockHash) -> None:
        """Record that `block` holds the full block of tokens named by `block_hash`."""
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash in self._cached:
            return  # an identical block is cached already; keep the first
        block.block_hash = block_hash
        self._cached[block_hash] = block

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; only possible when no block is held."""
        if self.num_free_blocks != self.num_usable_blocks:
            return False
        for block in self.blocks:
            block.block_hash = None
        self._cached.clear()
        return True

    def _evict(self, block: KVCacheBlock) -> None:
        if block.block_hash is not None:
            if self._cached.get(block.block_hash) is block:
                del self._cached[block.block_hash]
            block.block_hash = None
