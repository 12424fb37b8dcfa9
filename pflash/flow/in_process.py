"""The flow with in-process parts, for the CLI, benchmarks and tests: the drafter, probe and
store called in this process (`local_scorer`, `LocalProbe`, `LocalStore`), a drafter pass
shared by several configs (`ScoreOnce`), and one fresh compression (`compress_in_process`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import numpy as np

from pflash.compress.pipeline import (
    Compressed,
    CompressionRequest,
)
from pflash.compress.plan.segments import ProbeParams
from pflash.compress.render.rendered import (
    RenderedPrompt,
)
from pflash.compress.scoring import ScoreRequest, ScoreResult
from pflash.config import PFlashConfig
from pflash.flow.compressor import Compressor
from pflash.flow.parts import AsyncScorer
from pflash.views.records import View


def local_scorer(scorer: Callable[[ScoreRequest], ScoreResult]) -> AsyncScorer:
    """An in-process drafter (`DrafterScorer`, or any function of a `ScoreRequest`) as the
    flow's scorer. It runs when called; its result (or exception) is held in a future, which
    the probe and the flow may both await."""

    def score(request: ScoreRequest, conversation: str) -> Awaitable[ScoreResult]:
        future = asyncio.get_running_loop().create_future()
        try:
            future.set_result(scorer(request))
        except Exception as exc:  # surfaced where the flow awaits it, as a drafter failure
            future.set_exception(exc)
        return future

    return score


class LocalProbe:
    """An in-process segment probe (`models.probe.SegmentProbe`) as a `ProbeClient`."""

    def __init__(self, probe: Callable[[ScoreResult], tuple[np.ndarray, np.ndarray | None]]):
        self.probe = probe

    async def params(self) -> ProbeParams:
        return self.probe.params

    async def segment(self, scored: Awaitable[ScoreResult]) -> tuple[np.ndarray, np.ndarray | None]:
        return self.probe(await scored)


class LocalStore:
    """Views and adaptive keep ratios held in this process (`views.store.ViewStore`,
    `views.adaptive.AdaptiveKeep`), for the CLI, benchmarks and tests; the Serve app holds
    the same objects in its SessionStore actor."""

    def __init__(self, views, adaptive=None):
        self.views = views
        self.adaptive = adaptive

    async def lookup(self, tenant: str, keys: tuple) -> View | None:
        return self.views.lookup(tenant, keys)

    async def remember(self, view: View) -> None:
        self.views.remember(view)

    async def keep_ratio(self, session: str, r0: float) -> float:
        return r0 if self.adaptive is None else self.adaptive.ratio(session, r0)

    async def report_acceptance(self, session: str, accept_rate: float, r0: float) -> None:
        if self.adaptive is not None:
            self.adaptive.report(session, accept_rate, r0)


class ScoreOnce:
    """A scorer that runs the drafter once per distinct request: benchmarks compress one
    prompt under several configs (keep ratios, selection variants), and the scores depend
    only on the request (ids, windows, query, scorer kind), never on the budget.
    `last_ms` is the real pass's wall time, so a reused pass can still be charged to every
    config's compression time."""

    def __init__(self, scorer: Callable[[ScoreRequest], ScoreResult]):
        self.scorer = scorer
        self._key: ScoreRequest | None = None
        self._result: ScoreResult | None = None
        self._tapped = False
        self.last_ms = 0.0
        self.hit = False

    def __call__(self, request: ScoreRequest) -> ScoreResult:
        # the tap is extra output, not a different score: a pass with it serves one without;
        # every other field is in the key (a field left out once reused a pass that lacked
        # the projection scores a later variant asked for)
        key = replace(request, want_tap=False)
        self.hit = (
            key == self._key and self._result is not None and (self._tapped or not request.want_tap)
        )
        if not self.hit:
            t0 = time.perf_counter()
            self._result = self.scorer(request)
            self.last_ms = (time.perf_counter() - t0) * 1000.0
            self._key, self._tapped = key, request.want_tap
        return self._result


def compress_in_process(
    prompt: RenderedPrompt,
    config: PFlashConfig,
    *,
    target_tokenizer: Any,
    drafter_tokenizer: Any,
    scorer: Callable[[ScoreRequest], ScoreResult],
    probe: Any = None,
    trace: Any = None,
    **request: Any,
) -> Compressed:
    """One fresh compression in this process, no views: `Compressor.run` with in-process
    parts (the benchmark runners and tests compress many prompts this way). `request` are
    `CompressionRequest` fields (pflash_query, max_output, ...)."""
    compressor = Compressor(
        target_tokenizer=target_tokenizer,
        drafter_tokenizer=drafter_tokenizer,
        scorer=local_scorer(scorer),
        probe=LocalProbe(probe) if probe is not None else None,
        trace=trace,
        max_context=request.pop("max_context", None),
    )
    job = CompressionRequest(prompt=prompt, config=config, keep_text=True, **request)
    return compressor.run_sync(job)
