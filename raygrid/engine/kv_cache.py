"""Paged KV cache bookkeeping: blocks, the free-block queue, the block pool and prefix caching.

Only ids and counts live here; the KV tensors themselves are on the workers. A request owns a list
of block ids (its block table); token ``i`` of the request lives in slot
``block_table[i // block_size] * block_size + i % block_size``.

Prefix caching names each *full* block by a chained hash: sha256 of (parent block's hash, the block's
token ids, and for a request's first block its cache salt). Equal hashes mean equal prefixes, so a new
request can reuse the blocks of an earlier one; sha256 makes a collision as unlikely as a forged
certificate, so a hit needs no token comparison. The first block's parent is a root hash drawn at random
per engine, or derived from ``prefix_caching_hash_seed`` so that replicas of one deployment agree.
Freed blocks keep their hash and sit in the free queue in LRU order until they are reused (evicted).

When does a block enter the cache? When the scheduler hands it out for a step that will fill it, before
that step has run: the step's KV writes precede every attention read of the same step and of any later
one, so a request admitted later in the same step may share it (the n children of one prompt do). The
one way such a step can be withdrawn is a preemption inside ``schedule()``: the victim may have been
granted tokens earlier in the same step. ``free(request, num_written_tokens)`` then withdraws the hashes
of the blocks past what the request's earlier, launched steps wrote, so an unwritten block is never a hit.
That is simpler than caching after the step has run, which would need to know whether the request is
still the same incarnation when the step's output arrives, and would lose same-step sharing.
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass, field

from raygrid.engine.request import Request

BlockHash = bytes  # a sha256 digest


def root_block_hash(seed: str | None) -> BlockHash:
    """Parent hash of every request's first block: random per engine, or fixed by a seed string."""
    if seed is None:
        return os.urandom(32)
    return hashlib.sha256(b"raygrid-prefix-root\0" + seed.encode()).digest()


def hash_block_tokens(parent_hash: BlockHash, token_ids, cache_salt: str | None = None) -> BlockHash:
    """sha256 over a canonical serialization: the 32-byte parent hash, the token ids as little-endian
    int64, then a tagged, length-prefixed salt (only a request's first block carries one)."""
    h = hashlib.sha256(parent_hash)
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    if cache_salt is None:
        h.update(b"\0")
    else:
        salt = cache_salt.encode()
        h.update(b"\1" + struct.pack("<q", len(salt)) + salt)
    return h.digest()


@dataclass(eq=False)
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None
    # Links of the free-block queue; None when the block is not in it.
    prev_free: "KVCacheBlock | None" = field(default=None, repr=False)
    next_free: "KVCacheBlock | None" = field(default=None, repr=False)


class FreeBlockQueue:
    """Doubly linked list of free blocks: O(1) pop from the head, append to the tail and removal from
    the middle (a prefix-cache hit on a free block takes it out wherever it is)."""

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        self._head.next_free, self._tail.prev_free = self._tail, self._head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def popleft(self) -> KVCacheBlock:
        block = self._head.next_free
        if block is self._tail:
            raise RuntimeError("no free KV cache blocks")
        self.remove(block)
        return block

    def remove(self, block: KVCacheBlock) -> None:
        assert block.prev_free is not None and block.next_free is not None, "block is not free"
        block.prev_free.next_free = block.next_free
        block.next_free.prev_free = block.prev_free
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        last = self._tail.prev_free
        last.next_free = block
        block.prev_free, block.next_free = last, self._tail
        self._tail.prev_free = block
        self.num_free_blocks += 1

    def __iter__(self):
        block = self._head.next_free
        while block is not self._tail:
            yield block
            block = block.next_free


class BlockPool:
    """All KV blocks, the free queue and the map from block hash to cached block.

    Block 0 is the null block: never handed out, used to pad block tables.

    A block's object is made when the block is first handed out: a pool of 131,071 blocks (the CPU default for
    the built-in model) took 0.65 s to make up front, for blocks most runs never touch. The blocks not made yet
    (ids ``len(self.blocks)`` and up) are free and go first, in id order, before the free queue: where a queue
    of every block would have held them, ahead of anything freed.
    """

    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_kv_blocks must be >= 2 (one is the null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(0)]  # by id; grows as blocks are first handed out
        self.null_block = self.blocks[0]
        self.null_block.ref_cnt = 1
        self.free_queue = FreeBlockQueue([])  # blocks handed out before and freed since, least recently freed first
        self.cached_blocks: dict[BlockHash, KVCacheBlock] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free_blocks + self.num_blocks - len(self.blocks)

    @property
    def usage(self) -> float:
        """Fraction of usable blocks held by requests (free cached blocks count as free)."""
        usable = self.num_blocks - 1
        return 1.0 - self.num_free_blocks / usable

    def lookup(self, block_hash: BlockHash) -> KVCacheBlock | None:
        return self.cached_blocks.get(block_hash)

    def allocate(self, count: int) -> list[KVCacheBlock]:
        if count > self.num_free_blocks:
            raise RuntimeError(f"asked for {count} KV blocks, {self.num_free_blocks} free")
        out = []
        for _ in range(count):
            if len(self.blocks) < self.num_blocks:
                block = KVCacheBlock(len(self.blocks))
                self.blocks.append(block)
            else:
                block = self.free_queue.popleft()
                self.uncache(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: list[KVCacheBlock]) -> None:
        """Take a reference on prefix-cache hits; a hit on a free block pulls it out of the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def free(self, blocks: list[KVCacheBlock]) -> None:
        """Drop one reference each. Pass blocks tail first: the queue evicts from its head, so a
        request's last blocks (least likely shared) go before its prefix."""
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue.append(block)

    def cache(self, block: KVCacheBlock, block_hash: BlockHash) -> None:
        if block.block_hash is not None or block_hash in self.cached_blocks:
            return  # already cached, or the same content is cached in another block
        block.block_hash = block_hash
        self.cached_blocks[block_hash] = block

    def uncache(self, block: KVCacheBlock) -> None:
        """Forget the block's hash (eviction, or a withdrawn step)."""
        if block.block_hash is not None:
            if self.cached_blocks.get(block.block_hash) is block:
                del self.cached_blocks[block.block_hash]
            block.block_hash = None

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; only allowed when no request holds a block."""
        if self.num_free_blocks != self.num_blocks - 1:
            return False
        for block in self.blocks[1:]:
            self.uncache(block)
        return True


class KVCacheManager:
    """Gives requests KV blocks, shares cached prefixes, and takes the blocks back."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool, hash_seed: str | None = None) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.root_hash = root_block_hash(hash_seed)
        self.pool = BlockPool(num_blocks, enable_caching)
        self.req_blocks: dict[str, list[KVCacheBlock]] = {}
        # How many leading blocks of each request have been entered into the prefix cache.
        self.num_cached_blocks: dict[str, int] = {}

    @property
    def usage(self) -> float:
        return self.pool.usage

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def update_block_hashes(self, request: Request, num_blocks: int | None = None) -> None:
        """Extend the request's chained hashes over its newly full blocks, or over its first ``num_blocks``."""
        hashes, size = request.block_hashes, self.block_size
        tokens = request.all_token_ids
        end = len(tokens) if num_blocks is None else min(len(tokens), num_blocks * size)
        for start in range(len(hashes) * size, end - size + 1, size):
            # Only the first block carries the salt: the chain carries it onward.
            parent, salt = (hashes[-1], None) if hashes else (self.root_hash, request.cache_salt)
            hashes.append(hash_block_tokens(parent, tokens[start : start + size], salt))

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest run of cached full blocks that prefixes the request, and its token count.

        The hit is capped below ``num_tokens`` so at least one token is computed: the model needs it
        to produce the logits of the next token.
        """
        if not self.enable_caching:
            return [], 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[KVCacheBlock] = []
        # Hashed only as far as the first miss: a long prompt's later blocks are hashed as its steps fill them
        # (_cache_full_blocks), while the GPU runs its first chunk, not before that chunk can start.
        while len(hits) < max_blocks:
            self.update_block_hashes(request, len(hits) + 1)
            block = self.pool.lookup(request.block_hashes[len(hits)])
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: list[KVCacheBlock] | None = None,
    ) -> list[KVCacheBlock] | None:
        """Make room for ``num_new_tokens`` more tokens after the computed ones (plus any prefix-cache
        hits in ``new_computed_blocks``). Returns the newly allocated blocks, or None when the pool
        cannot supply them; then nothing changes."""
        blocks = self.req_blocks.get(request.request_id)
        if blocks is not None and not new_computed_blocks:
            # The common decode case: the tokens fit in the blocks the request already has.
            total_tokens = request.num_computed_tokens + num_new_tokens
            if total_tokens <= len(blocks) * self.block_size:
                if self.enable_caching and total_tokens // self.block_size > self.num_cached_blocks[request.request_id]:
                    self._cache_full_blocks(request, total_tokens)
                return []
        computed_hits = new_computed_blocks or []
        blocks = self.req_blocks.setdefault(request.request_id, [])
        num_hit_tokens = len(computed_hits) * self.block_size
        total_tokens = request.num_computed_tokens + num_hit_tokens + num_new_tokens
        num_needed = -(-total_tokens // self.block_size) - len(blocks) - len(computed_hits)
        # Hits sitting in the free queue must leave it, so they count against the free blocks too.
        num_free_hits = sum(1 for b in computed_hits if b.ref_cnt == 0)
        if max(num_needed, 0) + num_free_hits > self.pool.num_free_blocks:
            if not blocks:
                del self.req_blocks[request.request_id]
            return None
        self.pool.touch(computed_hits)
        blocks.extend(computed_hits)
        new_blocks = self.pool.allocate(max(num_needed, 0))
        blocks.extend(new_blocks)
        if self.enable_caching:
            self.num_cached_blocks.setdefault(request.request_id, len(computed_hits))
            self._cache_full_blocks(request, total_tokens)
        return new_blocks

    def _cache_full_blocks(self, request: Request, num_tokens: int) -> None:
        """Enter the blocks that will be full once this step's tokens are computed into the cache.

        The KV of these tokens is written before any attention of the same step reads it, so another
        request may hit these blocks even in the same step."""
        self.update_block_hashes(request, num_tokens // self.block_size)
        blocks = self.req_blocks[request.request_id]
        start = self.num_cached_blocks[request.request_id]
        end = min(num_tokens // self.block_size, len(request.block_hashes))
        for i in range(start, end):
            self.pool.cache(blocks[i], request.block_hashes[i])
        self.num_cached_blocks[request.request_id] = max(start, end)

    def free(self, request: Request, num_written_tokens: int | None = None) -> None:
        """Give the request's blocks back. ``num_written_tokens``: only that many of its tokens have KV
        written (or being written by a launched step); the hashes of its blocks past them are withdrawn."""
        blocks = self.req_blocks.pop(request.request_id, [])
        self.num_cached_blocks.pop(request.request_id, None)
        if num_written_tokens is not None:
            for block in blocks[num_written_tokens // self.block_size :]:
                self.pool.uncache(block)
        self.pool.free(reversed(blocks))

    def block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_blocks.get(request_id, [])]

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()
