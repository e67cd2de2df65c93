"""Block pool, free-block queue and prefix caching, checked block by block."""

from __future__ import annotations

import pytest

from raygrid.engine.kv_cache import ROOT_BLOCK_HASH, BlockPool, KVCacheManager, hash_block_tokens
from raygrid.engine.request import Request
from raygrid.engine.sampling_params import SamplingParams


def make_request(req_id: str, tokens: list[int], salt: str | None = None) -> Request:
    return Request(req_id, tokens, SamplingParams(), max_tokens=16, cache_salt=salt)


def test_null_block_is_never_handed_out():
    pool = BlockPool(5, enable_caching=True)
    assert pool.num_free_blocks == 4
    assert 0 not in [b.block_id for b in pool.allocate(4)]
    with pytest.raises(RuntimeError):
        pool.allocate(1)


def test_free_queue_is_lru_and_eviction_clears_the_hash():
    pool = BlockPool(4, enable_caching=True)
    a, b, c = pool.allocate(3)
    pool.cache(a, 111)
    pool.cache(b, 222)
    pool.free([b, a, c])  # b freed first: it is evicted first
    assert [blk.block_id for blk in pool.free_queue] == [b.block_id, a.block_id, c.block_id]
    (first,) = pool.allocate(1)
    assert first is b and b.block_hash is None and pool.lookup(222) is None
    assert pool.lookup(111) is a  # still cached while it sits in the free queue


def test_touch_takes_a_free_cached_block_out_of_the_queue():
    pool = BlockPool(4, enable_caching=True)
    (a,) = pool.allocate(1)
    pool.cache(a, 7)
    pool.free([a])
    assert pool.num_free_blocks == 3
    pool.touch([a])
    assert a.ref_cnt == 1 and pool.num_free_blocks == 2
    assert a not in list(pool.free_queue)


def test_block_hashes_are_chained_and_salted():
    kv = KVCacheManager(16, block_size=4, enable_caching=True)
    req = make_request("a", list(range(10)))
    kv.update_block_hashes(req)
    assert len(req.block_hashes) == 2  # only full blocks
    first = hash_block_tokens(ROOT_BLOCK_HASH, (0, 1, 2, 3))
    assert req.block_hashes == [first, hash_block_tokens(first, (4, 5, 6, 7))]
    salted = make_request("b", list(range(10)), salt="tenant-1")
    kv.update_block_hashes(salted)
    assert salted.block_hashes[0] != first and salted.block_hashes[1] != req.block_hashes[1]


def test_prefix_hit_shares_blocks_and_is_capped_below_num_tokens():
    kv = KVCacheManager(32, block_size=4, enable_caching=True)
    first = make_request("first", list(range(12)))
    assert kv.get_computed_blocks(first) == ([], 0)
    kv.allocate_slots(first, 12)
    first.num_computed_tokens = 12

    # Same 12 tokens: all three blocks are cached, but only two may be reused (one token must be computed).
    same = make_request("same", list(range(12)))
    hits, num_hit_tokens = kv.get_computed_blocks(same)
    assert num_hit_tokens == 8 and [b.block_id for b in hits] == kv.block_ids("first")[:2]
    kv.allocate_slots(same, 4, hits)
    assert kv.block_ids("same")[:2] == kv.block_ids("first")[:2]
    assert all(b.ref_cnt == 2 for b in hits)

    # Sharing stops at the first differing block.
    other = make_request("other", list(range(4)) + [99] * 8)
    assert kv.get_computed_blocks(other)[1] == 4


def test_freed_cached_blocks_still_hit_and_all_blocks_come_back():
    kv = KVCacheManager(10, block_size=4, enable_caching=True)
    a = make_request("a", list(range(17)))
    kv.allocate_slots(a, 17)
    kv.free(a)
    assert kv.num_free_blocks == 9
    b = make_request("b", list(range(17)))
    hits, n = kv.get_computed_blocks(b)
    assert n == 16
    kv.allocate_slots(b, 1, hits)
    assert kv.num_free_blocks == 9 - 5
    kv.free(b)
    assert kv.num_free_blocks == 9


def test_allocation_failure_changes_nothing():
    kv = KVCacheManager(4, block_size=4, enable_caching=True)
    req = make_request("a", list(range(20)))
    assert kv.allocate_slots(req, 20) is None
    assert kv.num_free_blocks == 3 and "a" not in kv.req_blocks


def test_prefix_caching_off_never_hits():
    kv = KVCacheManager(16, block_size=4, enable_caching=False)
    a = make_request("a", list(range(12)))
    kv.allocate_slots(a, 12)
    assert kv.get_computed_blocks(make_request("b", list(range(12)))) == ([], 0)
