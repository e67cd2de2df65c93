"""Block pool, free-block queue and prefix caching, checked block by block."""

from __future__ import annotations

import pytest

import hashlib
import struct

from raygrid.engine.kv_cache import BlockPool, KVCacheManager, hash_block_tokens, root_block_hash
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


def test_blocks_never_handed_out_go_first_in_id_order_and_are_made_on_first_use():
    """A block's object is made when it is first handed out (a pool of 131,071 blocks cost 0.65 s up front);
    the order is what a queue of every block would give: fresh blocks by id, then the freed, least recent first."""
    pool = BlockPool(1_000_000, enable_caching=True)
    assert len(pool.blocks) == 1 and pool.num_free_blocks == 999_999
    a, b = pool.allocate(2)
    pool.free([b, a])
    assert [blk.block_id for blk in pool.allocate(3)] == [3, 4, 5] and len(pool.blocks) == 6
    small = BlockPool(4, enable_caching=True)
    x, y, z = small.allocate(3)
    small.free([y, z, x])
    assert small.allocate(3) == [y, z, x] and small.num_free_blocks == 0


def test_free_queue_is_lru_and_eviction_clears_the_hash():
    pool = BlockPool(4, enable_caching=True)
    a, b, c = pool.allocate(3)
    pool.cache(a, b"111")
    pool.cache(b, b"222")
    pool.free([b, a, c])  # b freed first: it is evicted first
    assert [blk.block_id for blk in pool.free_queue] == [b.block_id, a.block_id, c.block_id]
    (first,) = pool.allocate(1)
    assert first is b and b.block_hash is None and pool.lookup(b"222") is None
    assert pool.lookup(b"111") is a  # still cached while it sits in the free queue


def test_touch_takes_a_free_cached_block_out_of_the_queue():
    pool = BlockPool(4, enable_caching=True)
    (a,) = pool.allocate(1)
    pool.cache(a, b"7")
    pool.free([a])
    assert pool.num_free_blocks == 3
    pool.touch([a])
    assert a.ref_cnt == 1 and pool.num_free_blocks == 2
    assert a not in list(pool.free_queue)


def test_block_hashes_are_sha256_chained_and_salted():
    kv = KVCacheManager(16, block_size=4, enable_caching=True, hash_seed="deployment-1")
    req = make_request("a", list(range(10)))
    kv.update_block_hashes(req)
    assert len(req.block_hashes) == 2  # only full blocks
    # The canonical serialization, written out independently of the code under test.
    root = hashlib.sha256(b"raygrid-prefix-root\0deployment-1").digest()
    first = hashlib.sha256(root + struct.pack("<4q", 0, 1, 2, 3) + b"\0").digest()
    second = hashlib.sha256(first + struct.pack("<4q", 4, 5, 6, 7) + b"\0").digest()
    assert kv.root_hash == root and req.block_hashes == [first, second]
    salted = make_request("b", list(range(10)), salt="tenant-1")
    kv.update_block_hashes(salted)
    salt = b"tenant-1"
    salted_first = hashlib.sha256(root + struct.pack("<4q", 0, 1, 2, 3) + b"\1" + struct.pack("<q", len(salt)) + salt).digest()
    assert salted.block_hashes[0] == salted_first
    assert salted.block_hashes[1] == hash_block_tokens(salted_first, [4, 5, 6, 7]) != second


def test_hash_root_is_random_unless_seeded():
    assert root_block_hash(None) != root_block_hash(None)
    assert root_block_hash("x") == root_block_hash("x") != root_block_hash("y")
    a, b = KVCacheManager(8, 4, True), KVCacheManager(8, 4, True)
    ra, rb = make_request("a", list(range(8))), make_request("b", list(range(8)))
    a.update_block_hashes(ra)
    b.update_block_hashes(rb)
    assert ra.block_hashes[0] != rb.block_hashes[0]  # two engines without a seed never agree


def test_salts_isolate_prefixes():
    kv = KVCacheManager(32, block_size=4, enable_caching=True)
    owner = make_request("owner", list(range(12)), salt="a")
    kv.allocate_slots(owner, 12)
    owner.num_computed_tokens = 12
    assert kv.get_computed_blocks(make_request("same-salt", list(range(12)), salt="a"))[1] == 8
    assert kv.get_computed_blocks(make_request("other-salt", list(range(12)), salt="b"))[1] == 0
    assert kv.get_computed_blocks(make_request("no-salt", list(range(12))))[1] == 0


def test_withdrawn_blocks_leave_the_cache():
    """Blocks past the written tokens (granted in a step that was withdrawn) lose their hashes on free."""
    kv = KVCacheManager(16, block_size=4, enable_caching=True)
    req = make_request("a", list(range(16)))
    kv.allocate_slots(req, 16)  # hashes all four blocks as they are handed out
    kv.free(req, num_written_tokens=5)  # only the first block is fully written
    hits, n = kv.get_computed_blocks(make_request("b", list(range(16))))
    assert n == 4 and len(kv.pool.cached_blocks) == 1


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


def test_a_long_prompt_is_hashed_as_its_chunks_fill_its_blocks():
    """Admission hashes a prompt only up to its first miss, so a long prompt's first chunk does not wait for the
    hashes of blocks later chunks fill; each chunk's blocks are hashed (and cached) when it is granted, and a
    request sharing the prefix then hits exactly what the chunks so far have filled."""
    kv = KVCacheManager(64, block_size=4, enable_caching=True)
    long = make_request("long", list(range(40)))  # 10 blocks, computed in chunks of 12 tokens
    assert kv.get_computed_blocks(long) == ([], 0)
    assert len(long.block_hashes) == 1  # the first block's, which missed
    for chunk, blocks in ((12, 3), (12, 6), (12, 9), (4, 10)):
        kv.allocate_slots(long, chunk)
        long.num_computed_tokens += chunk
        assert len(long.block_hashes) == blocks
        follower = make_request(f"after-{blocks}", list(range(40)) + [7])
        hits, n = kv.get_computed_blocks(follower)
        assert n == 4 * blocks and [b.block_id for b in hits] == kv.block_ids("long")[:blocks]
        # The follower hashed its prompt to the first block the long prompt has not filled yet, and no further.
        assert len(follower.block_hashes) == min(blocks + 1, 10)
    assert long.block_hashes == follower.block_hashes
