"""The remote parts the flow is given and how calls to them are shared: the scorer, probe and
store protocols, a value fetched once for every caller (`Once`), and the cause behind a remote
error."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import numpy as np

from pflash.background import being_cancelled, detached
from pflash.compress.plan.segments import ProbeParams
from pflash.compress.scoring import ScoreRequest, ScoreResult
from pflash.views.records import View

AsyncScorer = Callable[[ScoreRequest, str], Awaitable[ScoreResult]]


class ProbeClient(Protocol):
    """The segment probe: its cut parameters, and unit boundaries for a scored prompt."""

    async def params(self) -> ProbeParams: ...

    async def segment(
        self, scored: Awaitable[ScoreResult]
    ) -> tuple[np.ndarray, np.ndarray | None]: ...


class StoreClient(Protocol):
    """Views and adaptive keep ratios, shared by every ingress replica in the Serve app."""

    async def lookup(self, tenant: str, keys: tuple) -> View | None: ...

    async def remember(self, view: View) -> None: ...

    async def keep_ratio(self, session: str, r0: float) -> float: ...

    async def report_acceptance(self, session: str, accept_rate: float, r0: float) -> None: ...


class Once:
    """An async value fetched once (the target's context, the probe's parameters): callers
    that arrive while the fetch is in flight share it, so a burst of first requests makes
    one remote call, not one each (a call each can overflow the probe's queue, refusing
    requests after they waited out their drafter pass). A failed fetch is not kept: the next caller
    tries again.

    The fetch belongs to no caller (`pflash.background.detached`): started inside the first
    request and owned by it, it would die with it when that client gives up, and the next
    request, already waiting on it, would get Serve's bare 500. A caller that is not itself being cancelled never
    sees a cancellation: a fetch cancelled from elsewhere is `FetchCancelled`, an error its
    caller maps to its stage."""

    def __init__(self, fetch: Callable[[], Awaitable[Any]]):
        self._fetch = fetch
        self._task: asyncio.Future | None = None

    async def __call__(self) -> Any:
        if self._task is None:
            self._task = detached(self._fetch)
        task = self._task
        try:
            return await asyncio.shield(task)
        except BaseException as exc:
            if task.done() and self._task is task and (task.cancelled() or task.exception()):
                self._task = None
            if isinstance(exc, asyncio.CancelledError) and not being_cancelled():
                raise FetchCancelled("the shared fetch was cancelled") from None
            raise


class FetchCancelled(Exception):
    """A shared fetch (`Once`) was cancelled while a caller that was not cancelled waited."""


def _cancel(response: Any) -> None:
    """Stop a scorer response nobody will read (a Ray DeploymentResponse or an asyncio
    future both have `cancel`)."""
    cancel = getattr(response, "cancel", None)
    if cancel is not None:
        cancel()


def unwrap_remote_error(exc: BaseException) -> BaseException:
    """The original exception behind a Ray task error (its attributes intact)."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc
