"""`KVCacheManager`: which KV blocks each request holds, with check-then-commit allocation.

The scheduler asks `get_computed_blocks` for prefix-cache hits, then
`can_allocate` before `allocate_slots` (which never fails after a positive
check), and `free` when a request ends or is preempted. Callers see
`KVCacheBlocks` handles and block ids, never the pool's internals.

    request tokens:  | prefix-cache hit | computed | new tokens this step |
    blocks:          [ shared, touched  ][ owned   ][ owned, maybe new     ]
"""

from __future__ import annotations

from dataclasses import dataclass

from omnistage.core.block_pool import BlockPool, KVCacheBlock, hash_block_tokens
from omnistage.core.request import Request


@dataclass(frozen=True)
class KVCacheBlocks:
    """Opaque handle to blocks found or allocated for a request."""

    blocks: tuple[KVCacheBlock, ...] = ()

    @property
    def block_ids(self) -> list[int]:
        return [b.block_id for b in self.blocks]

    def __len__(self) -> int:
        return len(self.blocks)


class KVCacheManager:
    def __init__(
        self, num_blocks: int, block_size: int, max_model_len: int, enable_caching: bool
    ) -> None:
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.pool = BlockPool(num_blocks, enable_caching)
        self._req_blocks: dict[str, list[KVCacheBlock]] = {}
        self._num_hashed: dict[str, int] = {}
        """Per request: how many of its leading blocks were already offered to the prefix cache."""
        self.prefix_queries = 0
        self.prefix_hits = 0

    # -- queries ---------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        return self.pool.usage

    @property
    def num_requests(self) -> int:
        return len(self._req_blocks)

    def block_ids(self, request_id: str, start: int = 0) -> list[int]:
        """Ids of the request's blocks from index `start` on."""
        blocks = self._req_blocks.get(request_id, ())
        return [blocks[i].block_id for i in range(start, len(blocks))]

    def num_blocks(self, request_id: str) -> int:
        return len(self._req_blocks.get(request_id, ()))

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- prefix cache --------------------------------------------------------------
    def update_block_hashes(self, request: Request) -> None:
        """Extend `request.block_hashes` over every full block of its real tokens."""
        if request.stream_conditioning:
            return  # positions carry rows of another stage: token ids do not identify them
        bs = self.block_size
        num_full = request.num_tokens // bs
        tokens = None
        while len(request.block_hashes) < num_full:
            if tokens is None:
                tokens = request.all_token_ids
            i = len(request.block_hashes)
            parent = request.block_hashes[-1] if i else request.cache_salt
            block = tokens[i * bs : (i + 1) * bs]
            if request.output_codes:  # a position's input is its token and its codes
                first = max(i * bs - request.num_prompt_tokens, 0)
                last = (i + 1) * bs - request.num_prompt_tokens
                if last > 0:
                    block = [
                        *block,
                        -1,
                        *(c for row in request.output_codes[first:last] for c in row),
                    ]
            request.block_hashes.append(hash_block_tokens(parent, block))

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """Longest cached prefix of full blocks; at least one token is left to compute."""
        if not self.enable_caching:
            return KVCacheBlocks(), 0
        self.update_block_hashes(request)
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[KVCacheBlock] = []
        for block_hash in request.block_hashes[:max_hit_blocks]:
            block = self.pool.lookup(block_hash)
            if block is None:
                break
            hits.append(block)
        self.prefix_queries += request.num_tokens
        self.prefix_hits += len(hits) * self.block_size
        return KVCacheBlocks(tuple(hits)), len(hits) * self.block_size

    # -- allocation ------------------------------------------------------------------
    def _num_new_blocks(
        self, request: Request, num_new_tokens: int, computed: KVCacheBlocks
    ) -> tuple[int, int]:
        held = self._req_blocks.get(request.request_id, ())
        total = request.num_computed_tokens + len(computed) * self.block_size + num_new_tokens
        needed = self.blocks_needed(min(total, self.max_model_len)) - len(held) - len(computed)
        # Cached blocks nobody holds sit in the free queue: touching them uses up free blocks.
        revived = sum(1 for b in computed.blocks if b.ref_cnt == 0)
        return max(needed, 0), revived

    def covers(self, request: Request, num_new_tokens: int) -> bool:
        """Whether `allocate_slots(request, num_new_tokens)` would change nothing: the blocks
        held already cover the new tokens and no block of known tokens fills up (a decode's
        usual step; the scheduler then skips the allocation bookkeeping)."""
        held = self._req_blocks.get(request.request_id)
        if held is None:
            return False
        total = request.num_computed_tokens + num_new_tokens
        if min(total, self.max_model_len) > len(held) * self.block_size:
            return False
        if not self.enable_caching:
            return True
        full = min(total, request.num_tokens) // self.block_size
        return full <= self._num_hashed.get(request.request_id, 0)

    def can_allocate(
        self, request: Request, num_new_tokens: int, computed: KVCacheBlocks = KVCacheBlocks()
    ) -> bool:
        """Whether `allocate_slots` with the same arguments would succeed."""
        new, revived = self._num_new_blocks(request, num_new_tokens, computed)
        return new + revived <= self.pool.num_free_blocks

    def allocate_slots(
        self, request: Request, num_new_tokens: int, computed: KVCacheBlocks = KVCacheBlocks()
    ) -> KVCacheBlocks:
        """Give `request` slots for `num_new_tokens` more tokens (after its prefix hits).

        Returns the newly added blocks. Raises if `can_allocate` would have said no.
        Full blocks whose tokens are all known are entered into the prefix cache.
        """
        new, revived = self._num_new_blocks(request, num_new_tokens, computed)
        if new + revived > self.pool.num_free_blocks:
            raise RuntimeError(f"no KV blocks for request {request.request_id} (check first)")
        held = self._req_blocks.setdefault(request.request_id, [])
        if computed.blocks:
            self.pool.touch(computed.blocks)
            held.extend(computed.blocks)
        new_blocks = self.pool.take_new(new)
        held.extend(new_blocks)
        if self.enable_caching:
            computed_after = (
                request.num_computed_tokens + len(computed) * self.block_size + num_new_tokens
            )
            self._cache_full_blocks(request, held, min(computed_after, request.num_tokens))
        return KVCacheBlocks(tuple(computed.blocks) + tuple(new_blocks))

    def _cache_full_blocks(
        self, request: Request, held: list[KVCacheBlock], num_known: int
    ) -> None:
        full = num_known // self.block_size
        done = self._num_hashed.get(request.request_id, 0)
        if full <= done:
            return
        self.update_block_hashes(request)
        end = min(full, len(request.block_hashes), len(held))
        for i in range(done, end):
            if held[i].block_hash is None:
                self.pool.cache(held[i], request.block_hashes[i])
        self._num_hashed[request.request_id] = end

    def free(self, request: Request) -> None:
        """Release every block the request holds (tail first, for eviction order)."""
        blocks = self._req_blocks.pop(request.request_id, None)
        self._num_hashed.pop(request.request_id, None)
        if blocks:
            self.pool.free(reversed(blocks))

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()
