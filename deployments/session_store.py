"""SessionStore: one Ray actor holding the views (and adaptive keep ratios) of every
conversation, shared by all ingress replicas.

It is Ray Serve's deployment-scoped actor of the Ingress deployment (one instance per
deployment, recreated by the controller on failure). Views are a cache: losing the actor
costs the next turn a fresh compression, never a wrong answer, so a call that fails is
treated as "no view". Calls are small (hashes in, one View out).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import ray

from pflash.config import ViewsConfig, build_part
from pflash.views.adaptive import AdaptiveKeep
from pflash.views.decision import View
from pflash.views.store import ViewStore


@ray.remote(num_cpus=0, max_concurrency=64)
class SessionStoreActor:
    def __init__(self, config: dict[str, Any]):
        """`config`: the keys of the `ViewsConfig` (build_app)."""
        cfg = build_part(ViewsConfig, config)
        self.views = ViewStore.from_config(cfg)
        self.adaptive = AdaptiveKeep.from_config(cfg)

    def reconfigure(self, config: dict[str, Any]) -> None:
        cfg = build_part(ViewsConfig, config)
        self.views.reconfigure(cfg.view_capacity, cfg.view_ttl_s)

    def lookup(self, tenant: str, keys: tuple) -> View | None:
        return self.views.lookup(tenant, keys)

    def remember(self, view: View) -> None:
        self.views.remember(view)

    def keep_ratio(self, session: str, r0: float) -> float:
        return self.adaptive.ratio(session, r0)

    def report_acceptance(self, session: str, accept_rate: float | None, r0: float) -> None:
        self.adaptive.report(session, accept_rate, r0)

    def stats(self) -> dict[str, Any]:
        return {
            "views": dataclasses.asdict(self.views.stats()),
            "adaptive_sessions": len(self.adaptive),
            "time": time.time(),
        }


STORE_NAME = "sessions"
