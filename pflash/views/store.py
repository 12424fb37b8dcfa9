"""The view store: views of every conversation, bounded by an LRU capacity and a TTL, scoped
by tenant (ALGORITHM.md §6.1 lookup; DESIGN.md SessionStore).

Plain Python so a unit test can drive it with a fake clock; the Ray actor that holds one
instance for all ingress replicas is a thin wrapper (deployments/). Views are a cache:
losing one (eviction, expiry, an actor restart) costs a fresh compression, never a wrong
answer, because `decide_view` re-checks every view it is given.

Keys are `PrefixHash`es of **target** tokens: a view lives under the digest of its raw
prompt up to its generation prompt; a new prompt looks itself up with the digests of its
prefixes at its own turn boundaries (`views.view_keys`), and the longest match wins.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from pflash.config import ViewsConfig
from pflash.views.keys import PrefixHash
from pflash.views.records import View

_Key = tuple[str, int, str]  # (tenant, prefix length in target tokens, digest)


@dataclass(frozen=True)
class StoreStats:
    """Counters since the store was made. `size` views now held, at most `capacity`.

    `hits`/`misses` count lookups; `stored` remembers; `replaced` views dropped because a
    newer view of the same conversation (or the same key) was stored; `evicted` views
    dropped by the LRU capacity; `expired` views dropped by the TTL.
    """

    size: int
    capacity: int
    ttl_s: float
    hits: int
    misses: int
    stored: int
    replaced: int
    evicted: int
    expired: int


class ViewStore:
    """In-memory, bounded, tenant-scoped views, safe to call from many threads at once.

    The SessionStore actor serves its callers on a pool of threads, so every public method
    holds one lock for its whole read-modify-write: a lookup racing a drop must not put a
    dropped view back, nor two remembers race on the conversation index or the counters.
    Calls are small (a few dict operations), so the lock is held for microseconds.

    - `lookup(tenant, candidates)`: the view stored under the longest candidate key of
      that tenant, refreshed (LRU order, `used` time), or None. Expired views are dropped,
      never returned. Another tenant's view is never returned, even for equal tokens.
    - `remember(view)`: store it under `view.key`, dropping the conversation's older view
      and anything stored under the same key; then enforce capacity (LRU) and TTL.
    - `clock`: wall-clock seconds (the same clock `decide_view`'s `now` uses).
    """

    def __init__(
        self, capacity: int, ttl_s: float, *, clock: Callable[[], float] = time.time
    ) -> None:
        if capacity < 1 or not ttl_s > 0:
            raise ValueError(f"capacity must be >= 1 and ttl_s > 0, got {capacity}, {ttl_s}")
        self.capacity = capacity
        self.ttl_s = ttl_s
        self._clock = clock
        self._views: OrderedDict[_Key, View] = OrderedDict()  # least recently used first
        self._by_conversation: dict[tuple[str, str], _Key] = {}
        self._counts = dict(hits=0, misses=0, stored=0, replaced=0, evicted=0, expired=0)
        self._lock = threading.Lock()  # held by every public method; internals assume it

    @classmethod
    def from_config(cls, config: ViewsConfig, **kwargs) -> ViewStore:
        return cls(config.view_capacity, config.view_ttl_s, **kwargs)

    def reconfigure(self, capacity: int, ttl_s: float) -> None:
        """Apply a live config change (`user_config`): shrink at once if needed."""
        if capacity < 1 or not ttl_s > 0:
            raise ValueError(f"capacity must be >= 1 and ttl_s > 0, got {capacity}, {ttl_s}")
        with self._lock:
            self.capacity, self.ttl_s = capacity, ttl_s
            self._expire(self._clock())
            self._evict()

    def __len__(self) -> int:
        with self._lock:
            return len(self._views)

    def lookup(self, tenant: str, candidates: Sequence[PrefixHash]) -> View | None:
        with self._lock:
            return self._lookup(tenant, candidates)

    def remember(self, view: View) -> None:
        with self._lock:
            self._remember(view)

    def forget_tenant(self, tenant: str) -> int:
        """Drop every view of `tenant` (a revoked API key); returns how many."""
        with self._lock:
            keys = [k for k in self._views if k[0] == tenant]
            for k in keys:
                self._drop(k)
            return len(keys)

    def stats(self) -> StoreStats:
        with self._lock:
            return StoreStats(
                size=len(self._views), capacity=self.capacity, ttl_s=self.ttl_s, **self._counts
            )

    # ------------------------------------------------------------------ internals
    def _lookup(self, tenant: str, candidates: Sequence[PrefixHash]) -> View | None:
        now = self._clock()
        for cand in sorted(candidates, key=lambda c: c.length, reverse=True):
            key = (tenant, cand.length, cand.digest)
            view = self._views.get(key)
            if view is None:
                continue
            if self._expired(view, now):
                self._drop(key)
                self._counts["expired"] += 1
                continue
            view = replace(view, used=now)
            self._views[key] = view
            self._views.move_to_end(key)
            self._counts["hits"] += 1
            return view
        self._counts["misses"] += 1
        return None

    def _remember(self, view: View) -> None:
        now = self._clock()
        key = (view.tenant, view.key.length, view.key.digest)
        old = self._by_conversation.get((view.tenant, view.conversation))
        if old is not None and old != key and old in self._views:
            self._drop(old)
            self._counts["replaced"] += 1
        if key in self._views:
            self._drop(key)
            self._counts["replaced"] += 1
        self._views[key] = replace(view, used=now)
        self._by_conversation[(view.tenant, view.conversation)] = key
        self._counts["stored"] += 1
        self._expire(now)
        self._evict()

    def _expired(self, view: View, now: float) -> bool:
        return now - view.used > self.ttl_s

    def _drop(self, key: _Key) -> None:
        view = self._views.pop(key)
        conv = (view.tenant, view.conversation)
        if self._by_conversation.get(conv) == key:
            del self._by_conversation[conv]

    def _expire(self, now: float) -> None:
        # LRU order is `used` order, so expired views are all at the front.
        while self._views:
            key, view = next(iter(self._views.items()))
            if not self._expired(view, now):
                break
            self._drop(key)
            self._counts["expired"] += 1

    def _evict(self) -> None:
        while len(self._views) > self.capacity:
            self._drop(next(iter(self._views)))
            self._counts["evicted"] += 1
