"""Paged KV cache with prefix caching: hits, eviction order and block accounting."""

from __future__ import annotations

import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from capsim.engine.kv_cache import KVCache
from capsim.engine.request import SimRequest

ENV = simpy.Environment()


def req(content, prompt, session="s", rid=0):
    return SimRequest(ENV, rid, 0.0, prompt, 10, content, session)


def test_allocate_and_release():
    kv = KVCache(10)
    r = req("a", 100, session=None)
    assert kv.allocate(r, 4) and r.blocks == 4 and kv.free == 6
    assert not kv.allocate(r, 7)
    kv.release(r)
    assert kv.free == 10 and r.blocks == 0


def test_hits_keep_one_token_to_compute():
    kv = KVCache(100)
    first = req("a", 64)
    kv.allocate(first, 4)
    kv.register(first, 64)  # 4 full blocks published
    kv.release(first)
    assert kv.evictable == 4 and kv.free == 96
    same = req("a", 64)
    assert kv.cached_prefix(same) == 3  # (64 - 1) // 16: the last token is recomputed
    longer = req("a", 100)
    assert kv.cached_prefix(longer) == 4
    assert kv.cached_prefix(req("b", 100)) == 0
    assert kv.cached_prefix(req("a", 100, session=None)) == 0  # not reusable


def test_take_prefix_removes_blocks_from_the_evictable_pool():
    kv = KVCache(20)
    a = req("a", 80)
    kv.allocate(a, 5)
    kv.register(a, 80)
    kv.release(a)
    b = req("a", 120)
    hits = kv.cached_prefix(b)
    assert hits == 5 and kv.evictable_among(b, hits) == 5
    kv.take_prefix(b, hits)
    assert kv.evictable == 0 and kv.used == 5 and b.total_blocks == 5


def test_eviction_is_lru_by_stream_tail_first():
    kv = KVCache(8)
    for name in ("old", "new"):
        r = req(name, 64)
        kv.allocate(r, 4)
        kv.register(r, 64)
        kv.release(r)
    assert kv.free == 0 and kv.evictable == 8
    taker = req("x", 48, session=None)
    assert kv.allocate(taker, 3)
    assert kv.streams["old"].cached == 1  # three tail blocks of the older stream went first
    assert kv.streams["new"].cached == 4


def test_shared_prefix_stays_held_until_the_last_holder_leaves():
    kv = KVCache(20)
    a = req("a", 64)
    kv.allocate(a, 4)
    kv.register(a, 64)
    b = req("a", 100)
    kv.take_prefix(b, kv.cached_prefix(b))
    kv.release(a)
    assert kv.evictable == 0  # b still holds all four
    kv.release(b)
    assert kv.evictable == 4


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4), st.integers(1, 12)), max_size=60))
def test_accounting_invariants(ops):
    kv = KVCache(40)
    live: list[SimRequest] = []
    for op, stream, size in ops:
        if op == 0:  # a new request takes its cached prefix and allocates more
            r = req(f"s{stream}", size * 16 + 1, rid=len(live))
            hits = kv.cached_prefix(r)
            if size > kv.allocatable - kv.evictable_among(r, hits):
                continue
            kv.take_prefix(r, hits)
            assert kv.allocate(r, size)
            live.append(r)
        elif op == 1 and live:
            r = live[size % len(live)]
            kv.register(r, r.total_blocks * 16)
        elif op == 2 and live:
            kv.release(live.pop(size % len(live)))
        elif op == 3 and live:
            kv.allocate(live[0], min(size, kv.allocatable))
        assert kv.free >= 0 and kv.evictable >= 0
        held = sum(r.total_blocks for r in live)
        assert kv.used >= 0
        assert kv.free + kv.evictable + kv.used == kv.num_blocks
        private = sum(r.blocks for r in live)
        cached = sum(s.cached for s in kv.streams.values())
        assert private + cached + kv.free == kv.num_blocks
        # shared prefixes count once in the pool but once per holder in ``held``
        assert held >= kv.used
    for r in live:
        kv.release(r)
    assert kv.free + kv.evictable == kv.num_blocks


def test_state_blocks_are_held_while_running_and_freed_with_the_request():
    kv = KVCache(100, state_blocks=7)
    r = req("a", 100, session=None)
    assert kv.allocate(r, 10)
    kv.admit_state()
    assert kv.free == 83 and kv.used == 17
    kv.release(r)
    assert kv.free == 100 and kv.used == 0
