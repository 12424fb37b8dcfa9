"""ViewStore: longest-prefix lookup, tenant scope, one view per conversation, LRU and TTL."""

from __future__ import annotations

import pytest

from pflash.config import build_config
from pflash.spans import Span
from pflash.views.keys import boundary_hashes, token_digest
from pflash.views.records import View
from pflash.views.store import ViewStore

RAW = tuple(range(5000, 5100))  # target tokens of one growing conversation


def _view(prefix: int, tenant: str = "tenant-a", conversation: str = "c1", turn: int = 1):
    """A view stored under RAW[:prefix] (its generation prompt starts at `prefix`)."""
    raw = RAW[: prefix + 3]
    return View(
        tenant=tenant,
        conversation=conversation,
        raw_len=len(raw),
        raw_digest=token_digest(raw),
        raw_gen_begin=prefix,
        raw_prefix_digest=token_digest(RAW[:prefix]),
        drafter_gen_begin=prefix,
        drafter_prefix_digest=token_digest(RAW[:prefix]),
        view_tokens=tuple(range(prefix // 2)) + (1, 2, 3),
        view_gen_begin=prefix // 2,
        spans=(Span(0, prefix),),
        turn=turn,
        created=0.0,
        used=0.0,
    )


class Clock:
    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _keys(*boundaries):
    return boundary_hashes(RAW, boundaries)


def test_lookup_returns_the_view_of_the_longest_matching_prefix():
    store = ViewStore(8, 60.0, clock=Clock())
    store.remember(_view(10, conversation="c1"))
    store.remember(_view(20, conversation="c2"))
    found = store.lookup("tenant-a", _keys(5, 10, 20, 30))
    assert found is not None and found.raw_gen_begin == 20
    assert store.lookup("tenant-a", _keys(5, 10, 15)).raw_gen_begin == 10
    assert store.lookup("tenant-a", _keys(5, 15, 30)) is None


def test_views_of_one_tenant_are_never_returned_for_another():
    store = ViewStore(8, 60.0, clock=Clock())
    store.remember(_view(10, tenant="tenant-a"))
    assert store.lookup("tenant-b", _keys(10)) is None
    assert store.lookup("tenant-a", _keys(10)).tenant == "tenant-a"
    store.remember(_view(10, tenant="tenant-b"))
    assert len(store) == 2  # equal tokens, separate tenants, separate views
    assert store.lookup("tenant-b", _keys(10)).tenant == "tenant-b"
    assert store.forget_tenant("tenant-a") == 1
    assert store.lookup("tenant-a", _keys(10)) is None


def test_remember_drops_the_older_view_of_the_same_conversation():
    store = ViewStore(8, 60.0, clock=Clock())
    store.remember(_view(10, conversation="c1", turn=1))
    store.remember(_view(30, conversation="c1", turn=2))
    assert len(store) == 1
    assert store.lookup("tenant-a", _keys(10)) is None
    assert store.lookup("tenant-a", _keys(10, 30)).turn == 2
    assert store.stats().replaced == 1


def test_same_prefix_from_another_conversation_replaces_the_entry_only():
    store = ViewStore(8, 60.0, clock=Clock())
    store.remember(_view(10, conversation="c1"))
    store.remember(_view(10, conversation="c2"))  # an identical first turn
    assert len(store) == 1 and store.lookup("tenant-a", _keys(10)).conversation == "c2"
    store.remember(_view(30, conversation="c1"))  # c1 moves on: c2's view stays
    assert len(store) == 2
    assert store.lookup("tenant-a", _keys(10)).conversation == "c2"


def test_lru_capacity_evicts_the_least_recently_used_view():
    store = ViewStore(2, 60.0, clock=Clock())
    store.remember(_view(10, conversation="a"))
    store.remember(_view(20, conversation="b"))
    assert store.lookup("tenant-a", _keys(10)) is not None  # a is now the most recent
    store.remember(_view(30, conversation="c"))
    assert len(store) == 2
    assert store.lookup("tenant-a", _keys(20)) is None  # b was evicted
    assert store.lookup("tenant-a", _keys(10)) is not None
    assert store.lookup("tenant-a", _keys(30)) is not None
    assert store.stats().evicted == 1


def test_ttl_expires_views_not_used_for_ttl_seconds():
    clock = Clock(1000.0)
    store = ViewStore(8, 10.0, clock=clock)
    store.remember(_view(10, conversation="a"))
    clock.t = 1008.0
    found = store.lookup("tenant-a", _keys(10))
    assert found is not None and found.used == 1008.0  # a lookup refreshes the view
    clock.t = 1017.0
    assert store.lookup("tenant-a", _keys(10)) is not None
    clock.t = 1027.5
    assert store.lookup("tenant-a", _keys(10)) is None
    assert len(store) == 0 and store.stats().expired == 1


def test_remember_sweeps_expired_views():
    clock = Clock(0.0)
    store = ViewStore(8, 10.0, clock=clock)
    store.remember(_view(10, conversation="a"))
    clock.t = 11.0
    store.remember(_view(20, conversation="b"))
    assert len(store) == 1 and store.stats().expired == 1


def test_reconfigure_shrinks_the_store_at_once():
    store = ViewStore(4, 60.0, clock=Clock())
    for n, conv in ((10, "a"), (20, "b"), (30, "c")):
        store.remember(_view(n, conversation=conv))
    store.reconfigure(1, 60.0)
    assert len(store) == 1 and store.lookup("tenant-a", _keys(30)) is not None


def test_stats_count_lookups_and_stores():
    store = ViewStore.from_config(build_config({"view_capacity": 3, "view_ttl_s": 5}, env={}))
    store.remember(_view(10))
    store.lookup("tenant-a", _keys(10))
    store.lookup("tenant-a", _keys(20))
    stats = store.stats()
    assert (stats.size, stats.capacity, stats.ttl_s) == (1, 3, 5.0)
    assert (stats.hits, stats.misses, stats.stored) == (1, 1, 1)


@pytest.mark.parametrize("capacity,ttl", [(0, 10.0), (4, 0.0)])
def test_store_bounds_must_be_positive(capacity, ttl):
    with pytest.raises(ValueError):
        ViewStore(capacity, ttl)


# ---------------------------------------------------------------------- many callers at once
# The SessionStore actor serves 64 calls at once on threads. These tests hammer the real
# classes from 64 threads with the interpreter switching threads every microsecond, then
# check what every caller did against what the store says.

CALLERS = 64
ROUNDS = 60


def _hammer(worker) -> list[BaseException]:
    """Run `worker(i)` on CALLERS threads released together; the exceptions they raised."""
    import sys
    import threading

    errors: list[BaseException] = []
    start = threading.Barrier(CALLERS)

    def run(i: int) -> None:
        start.wait()
        try:
            worker(i)
        except BaseException as exc:  # every failure is reported, not lost in a thread
            errors.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(CALLERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    return errors


def _check_index(store: ViewStore) -> None:
    """Each stored view is its conversation's one view, and the index names only them."""
    views, index = dict(store._views), dict(store._by_conversation)
    assert {(v.tenant, v.conversation): k for k, v in views.items()} == index


def test_64_concurrent_callers_keep_the_view_store_consistent():
    """Lookups, remembers, drops (forget_tenant) and TTL expiry from 64 threads: no call
    fails, every lookup and remember is counted once, no dropped view comes back."""
    import itertools

    ticks = itertools.count()
    store = ViewStore(4096, 0.05, clock=lambda: next(ticks) * 1e-4)  # 500 calls' TTL
    dropped = [0] * CALLERS
    revived = []

    def worker(i: int) -> None:
        tenant = f"tenant-{i % 16}"  # 4 threads per tenant: drops race the others' calls
        store.remember(_view(10, tenant=f"stale-{i}", conversation="c"))  # left to expire
        for r in range(ROUNDS):
            conv = f"c{i}-{r % 3}"
            store.remember(_view(10 + (r % 40), tenant=tenant, conversation=conv, turn=r))
            store.lookup(tenant, _keys(5, 10 + (r % 40), 60))
            if r % 20 == 19:
                dropped[i] += store.forget_tenant(tenant)
        own = f"solo-{i}"  # a tenant only this thread uses: once dropped, never seen again
        store.remember(_view(10, tenant=own, conversation="c"))
        dropped[i] += store.forget_tenant(own)
        for _ in range(5):
            if store.lookup(own, _keys(10)) is not None:
                revived.append(own)

    errors = _hammer(worker)
    stats = store.stats()
    assert errors == []
    assert revived == []
    lookups = CALLERS * (ROUNDS + 5)
    assert stats.hits + stats.misses == lookups
    assert stats.stored == CALLERS * (ROUNDS + 2)
    assert stats.expired >= CALLERS  # at least every stale view expired
    gone = stats.replaced + stats.evicted + stats.expired + sum(dropped)
    assert stats.stored - gone == stats.size == len(store._views)
    _check_index(store)


def test_64_concurrent_callers_keep_the_session_store_actor_consistent():
    """The actor's own class (what Ray runs with max_concurrency=64): views and adaptive
    keep ratios moved from 64 threads, then the counts equal what the callers did."""
    from deployments.session_store import SessionStore

    actor = SessionStore({"view_capacity": 4096, "adaptive_sessions": 4096})

    def worker(i: int) -> None:
        for r in range(ROUNDS):
            actor.remember(_view(10 + r, tenant=f"t{i}", conversation=f"c{r}"))
            assert actor.lookup(f"t{i}", _keys(10 + r)).conversation == f"c{r}"
            actor.report_acceptance(f"t{i}:s{r % 7}", 0.5, 0.3)
            ratio = actor.keep_ratio(f"t{i}:s{r % 7}", 0.3)
            assert 0 < ratio <= 1
            actor.stats()
        forgotten = actor.reconfigure({"view_capacity": 4096}, forget=[f"t{i}"])
        assert forgotten == {f"t{i}": ROUNDS}
        assert actor.lookup(f"t{i}", _keys(10)) is None

    errors = _hammer(worker)
    stats = actor.stats()
    assert errors == []
    assert stats["views"]["size"] == 0
    assert stats["views"]["stored"] == stats["views"]["hits"] == CALLERS * ROUNDS
    assert stats["views"]["misses"] == CALLERS
    assert stats["adaptive_sessions"] == CALLERS * 7
    _check_index(actor.views)
