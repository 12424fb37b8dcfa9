"""Work that belongs to no request, started from inside one.

A Serve replica cancels the remote calls a request made when that request is cancelled (its
client went away, a proxy timeout), and it finds them through the request's context, which
an asyncio task inherits from whoever creates it. A task meant to outlive the request that
happens to start it (a fetch other requests share, a background refresher) is therefore
started in a context of its own: otherwise it dies with that request, and whoever waits on
it sees a cancellation it never asked for, which Serve answers with a bare 500.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from typing import Any


def detached(fn: Callable[[], Awaitable[Any]]) -> asyncio.Task:
    """`fn()` as a task of the running loop in an empty context: even its first,
    synchronous step (a handle's `.remote()`) runs outside the caller's request."""

    async def run() -> Any:
        return await fn()

    return asyncio.get_running_loop().create_task(run(), context=contextvars.Context())


def being_cancelled() -> bool:
    """Whether the running task has been asked to stop (its request was cancelled, a
    deadline), as opposed to a cancellation raised out of something it awaited."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
