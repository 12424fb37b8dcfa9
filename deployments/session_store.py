"""SessionStore: one Ray actor holding the views (and adaptive keep ratios) of every
conversation, shared by all ingress replicas.

It is Ray Serve's deployment-scoped actor of the Ingress deployment (one instance per
deployment, recreated by the controller on failure). Views are a cache: losing the actor
costs the next turn a fresh compression, never a wrong answer, so a call that fails is
treated as "no view". Calls are small (hashes in, one View out).

The actor serves up to 64 calls at once on a pool of threads (`max_concurrency`), so the
state it holds must be safe across threads: the `ViewStore` locks itself, and the adaptive
keep ratios are read and moved under this class's own lock. The ingress calls it through
`SessionStoreClient`.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterable
from typing import Any

import ray
from ray import serve

from pflash.config import PFlashConfig, ViewsConfig, build_part
from pflash.views.adaptive import AdaptiveKeep
from pflash.views.records import View
from pflash.views.store import ViewStore


class SessionStore:
    """The actor's state and calls, as a plain class (`SessionStoreActor` is its Ray actor)."""

    def __init__(self, config: dict[str, Any]):
        """`config`: the keys of the `ViewsConfig` (build_app)."""
        cfg = build_part(ViewsConfig, config)
        self.views = ViewStore.from_config(cfg)
        self.adaptive = AdaptiveKeep.from_config(cfg)
        self._adaptive_lock = threading.Lock()

    def reconfigure(self, config: dict[str, Any], forget: Iterable[str] = ()) -> dict[str, int]:
        """Apply the live `ViewsConfig` keys (the ingress pushes its `user_config`) and drop
        every view of the tenants in `forget` (revoked API keys). Returns how many views of
        each forgotten tenant were dropped."""
        cfg = build_part(ViewsConfig, config)
        self.views.reconfigure(cfg.view_capacity, cfg.view_ttl_s)
        return {tenant: self.views.forget_tenant(tenant) for tenant in forget}

    def lookup(self, tenant: str, keys: tuple) -> View | None:
        return self.views.lookup(tenant, keys)

    def remember(self, view: View) -> None:
        self.views.remember(view)

    def keep_ratio(self, session: str, r0: float) -> float:
        with self._adaptive_lock:
            return self.adaptive.ratio(session, r0)

    def report_acceptance(self, session: str, accept_rate: float | None, r0: float) -> None:
        with self._adaptive_lock:
            self.adaptive.report(session, accept_rate, r0)

    def stats(self) -> dict[str, Any]:
        with self._adaptive_lock:
            sessions = len(self.adaptive)
        return {
            "views": dataclasses.asdict(self.views.stats()),
            "adaptive_sessions": sessions,
            "time": time.time(),
        }


@ray.remote(num_cpus=0, max_concurrency=64)
class SessionStoreActor(SessionStore):
    """The deployment-scoped actor (build_app); its process is titled `ray::SessionStoreActor`."""


STORE_NAME = "sessions"


def views_part(config: PFlashConfig) -> dict[str, Any]:
    """The session store's part of `config`: its `ViewsConfig` keys that differ from the
    defaults (what `build_app` gives the actor)."""
    return config.part(ViewsConfig).model_dump(mode="json", exclude_defaults=True)


class SessionStoreClient:
    """The SessionStore actor as the flow's `StoreClient` (the Ingress's), resolved on first
    use and again after a failure (the controller recreates it).

    The actor is created with the views config of the deploy (`build_app`); a live change
    (`user_config`) and the tenants of revoked API keys reach it through `configure`, and
    are pushed before the next call, also to a recreated actor, which starts from the
    deploy's config again."""

    def __init__(self, views: dict[str, Any]) -> None:
        self.actor = None
        self.views = views  # the live `ViewsConfig` keys
        self.forget: set[str] = set()  # tenants whose views to drop
        self._pushed = False

    def configure(self, views: dict[str, Any], forget: Iterable[str] = ()) -> None:
        self.views, self._pushed = views, False
        self.forget |= set(forget)

    async def _call(self, method: str, *args):
        try:
            if self.actor is None:
                self.actor = serve.get_deployment_actor(STORE_NAME)
                self._pushed = False
            if not self._pushed:
                forget = tuple(self.forget)
                await self.actor.reconfigure.remote(self.views, forget)
                self.forget -= set(forget)
                self._pushed = True
            return await getattr(self.actor, method).remote(*args)
        except Exception:
            self.actor = None
            raise

    async def lookup(self, tenant, keys):
        return await self._call("lookup", tenant, keys)

    async def remember(self, view):
        return await self._call("remember", view)

    async def keep_ratio(self, session, r0):
        return await self._call("keep_ratio", session, r0)

    async def report_acceptance(self, session, accept_rate, r0):
        return await self._call("report_acceptance", session, accept_rate, r0)

    async def stats(self):
        return await self._call("stats")
