"""Readiness of the deployment graph (`/readyz`), answered from a cache.

Load balancers and KubeRay's probe ask `/readyz` often, and anyone can ask it. Were each
request to call the drafter, the target and the session store, a flood of it would queue
behind (and hold back) real traffic, and under load every check would time out behind the
scoring passes at once. So one background task per ingress replica asks each deployment
every `interval_s` (each call bounded by `timeout_s`), whatever the request rate, and
`/readyz` answers from what it last heard.

A deployment is ready while its last answer is at most `max_age_s` old: one slow answer
under load does not flip it, a deployment silent for longer does, and so does a refresher
that stopped (nothing refreshes the answers, so they age out). Fail closed: never heard
from is not ready.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pflash.background import being_cancelled, detached
from pflash.serving.envelope import error_response, http_error

log = logging.getLogger(__name__)

READY_INTERVAL_S = 5.0  # seconds between two rounds of checks
READY_TIMEOUT_S = 5.0  # how long each deployment has to answer one check
READY_MAX_AGE_S = 2 * READY_INTERVAL_S + READY_TIMEOUT_S  # an answer older is not ready
RETRY_AFTER_S = 5


class CheckCancelled(Exception):
    """A check's call was cancelled by something other than the refresher (the runtime)."""


@dataclass(frozen=True)
class CheckState:
    """What one deployment last said. Times are `time.monotonic()` seconds.

    `answered_at`: when it last answered in time (None: never); `failure`: the exception
    type of the latest attempt when that attempt failed (None when it answered)."""

    answered_at: float | None = None
    failure: str | None = None


def check_status(state: CheckState, now: float, max_age_s: float) -> str:
    """ "ok" while the last answer is at most `max_age_s` old, else "unavailable"."""
    fresh = state.answered_at is not None and now - state.answered_at <= max_age_s
    return "ok" if fresh else "unavailable"


def readiness_answer(
    states: Mapping[str, CheckState], now: float, max_age_s: float = READY_MAX_AGE_S
) -> tuple[int, dict[str, Any]]:
    """(HTTP status, body) of `/readyz`: 200 `{"status": "ready", "checks"}` when every
    deployment answered recently, else a 503 in the OpenAI error envelope naming those that
    did not (with the same `checks`). No deployment at all is not ready."""
    checks = {name: check_status(state, now, max_age_s) for name, state in states.items()}
    if checks and all(v == "ok" for v in checks.values()):
        return 200, {"status": "ready", "checks": checks}
    missing = [k for k, v in checks.items() if v != "ok"]
    message = "not ready: " + (", ".join(missing) or "no deployment to check")
    status, body = error_response(http_error(503, message, "not_ready", "service_unavailable"))
    return status, {**body, "checks": checks}


async def _awaited(call: Any) -> Any:
    return await call


class ReadinessCache:
    """The background refresher and its cache, for one ingress replica.

    `checks`: name -> a function starting one remote check (its awaitable's value is
    ignored; an exception or a timeout is a failed check). The refresher starts on the
    first `answer()` (it needs the replica's event loop) and restarts there if it ever
    stopped; the first callers wait for its first round, every later one is answered at
    once from the cache. It belongs to no probe (`pflash.background.detached`): a probe
    client that gives up (Kubernetes' default timeout is 1 s, and a first round waits on
    deployments still loading) cancels only its own request, not the checks in flight, and
    a check cancelled from elsewhere is a failed check, not the refresher's end."""

    def __init__(
        self,
        checks: Mapping[str, Callable[[], Awaitable[Any]]],
        *,
        interval_s: float = READY_INTERVAL_S,
        timeout_s: float = READY_TIMEOUT_S,
        max_age_s: float = READY_MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.checks = dict(checks)
        self.interval_s, self.timeout_s, self.max_age_s = interval_s, timeout_s, max_age_s
        self.states: dict[str, CheckState] = {name: CheckState() for name in self.checks}
        self._clock = clock
        self._task: asyncio.Task | None = None
        self._first_round: asyncio.Event | None = None

    async def answer(self) -> tuple[int, dict[str, Any]]:
        """`readiness_answer` of the cache, starting the refresher if it is not running."""
        if self._task is None or self._task.done():
            self._first_round = self._first_round or asyncio.Event()
            self._task = detached(self._refresh_forever)
        if not self._first_round.is_set():
            try:  # a round is bounded by timeout_s; the slack covers scheduling
                async with asyncio.timeout(self.timeout_s + 1.0):
                    await self._first_round.wait()
            except TimeoutError:
                pass
        return readiness_answer(self.states, self._clock(), self.max_age_s)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def refresh(self) -> None:
        """One round: every deployment asked once, concurrently, each within timeout_s."""
        await asyncio.gather(*(self._check(name) for name in self.checks))

    async def _check(self, name: str) -> None:
        try:
            try:
                await asyncio.wait_for(_awaited(self.checks[name]()), self.timeout_s)
            except asyncio.CancelledError:
                if being_cancelled():
                    raise
                raise CheckCancelled(name) from None
        except Exception as exc:
            log.warning("readyz: %s did not answer: %s", name, type(exc).__name__)
            self.states[name] = CheckState(self.states[name].answered_at, type(exc).__name__)
        else:
            self.states[name] = CheckState(self._clock(), None)

    async def _refresh_forever(self) -> None:
        while True:
            await self.refresh()
            self._first_round.set()
            await asyncio.sleep(self.interval_s)
