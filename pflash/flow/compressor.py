"""The one compression flow of a request: gate → plan → view → score → probe → select →
assemble → fit, with every decision made here and every remote part injected.

The ingress, `pflash compress` and the benchmark runners all call `Compressor.run`; what
differs between them is only what is plugged in. `run` is two steps: `start` plans (query
and required-string mapping, budget, whether what must be kept fits the context) and
raises every client mistake it finds; the returned `Pending.finish` runs the rest (view,
drafter, probe, selection, assembly). The ingress awaits `start` before it sends a byte,
so a client mistake is a 4xx, never an in-band error after a 200.

- `scorer(request, conversation)`: the drafter. It returns an awaitable of `ScoreResult`
  that may be awaited more than once (a Ray `DeploymentResponse`, or an asyncio task for an
  in-process scorer), so the same awaitable can be handed to the probe: in the Serve app
  the drafter's response then travels to the SegmentProbe as an object ref, never through
  the ingress.
- `probe`: the segment probe (`ProbeClient`), or None when none is configured.
- `store`: where views and adaptive keep ratios live (`StoreClient`), or None: without a
  store there are no views (every request is a fresh compression) and no adaptive keep.
- `max_context`: the target's context in tokens (an int, or an async callable asked once:
  concurrent first requests share that one call, see `Once`).
- `record(name, value=1.0, **tags)`: metrics (pflash/serving/metrics.py names); a no-op by default.
- `offload(fn, *args, **kwargs)`: where the pure CPU steps (plan, select, view decision)
  run. The ingress passes `asyncio.to_thread` so its event loop keeps serving; in-process
  callers run them inline.

Fail closed: a scorer, probe, mapping, selection or ceiling failure raises
`CompressionFailed` naming the stage. Only a drafter-stage failure under
`on_drafter_error: bypass` serves the prompt uncompressed (counted as a bypass); a failure
once the scores are in is selection's (or the stage it names) and is never bypassed. Every
`pflash_required` string is checked in what is served, whatever served it.

The request it takes (`pipeline.CompressionRequest`) is made from an API request and checked
in `pflash.flow.request`, the protocols of the injected parts are in `pflash.flow.parts`, and
their in-process versions in `pflash.flow.in_process`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from pflash.compress.finish import finish
from pflash.compress.pipeline import (
    Compressed,
    CompressionRequest,
    Prepared,
    ms_since,
    passthrough,
    prepare,
    scorer_failure_action,
    uncompressed,
)
from pflash.compress.plan.budget import configured_keep_ratio
from pflash.compress.scoring import is_skipped_read_ahead
from pflash.compress.turn_memo import TurnMemo
from pflash.config import CompressionPart, PFlashConfig, ViewPart
from pflash.errors import CompressionFailed, StageUnavailable, runtime_failure
from pflash.flow.parts import (
    AsyncScorer,
    Once,
    ProbeClient,
    StoreClient,
    _cancel,
    unwrap_remote_error,
)
from pflash.flow.request import (
    check_context,
    check_required,
)
from pflash.views.decision import decide_view
from pflash.views.keys import view_keys
from pflash.views.records import served_result

log = logging.getLogger(__name__)

READ_AHEAD_MAX = 4  # background drafter passes in flight per compressor (`_read_ahead`)


@dataclass(frozen=True)
class Pending:
    """A request whose planning is done (`Compressor.start`): the client's mistakes that
    planning finds are raised by then. `finish` runs the rest of the flow.

    - `request`: the request with what the flow learns before planning filled in (the
      target's context, r0);
    - `prepared`: `pipeline.prepare` of the prompt; None in mode off;
    - `served`: the answer when planning already decided it (mode off), else None.
    """

    compressor: Compressor = field(repr=False)
    request: CompressionRequest
    prepared: Prepared | None = None
    served: Compressed | None = None

    async def finish(self) -> Compressed:
        """View → drafter → probe → select/assemble → checks; fail closed."""
        if self.served is not None:
            return self.served
        return await self.compressor._finish(self)


def _no_metrics(name: str, value: float = 1.0, **tags: Any) -> None:
    return None


async def inline(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a pure step in the calling thread (in-process callers)."""
    return fn(*args, **kwargs)


class Compressor:
    """The flow of one request (see the module docstring for what is injected)."""

    def __init__(
        self,
        *,
        target_tokenizer: Any,
        drafter_tokenizer: Any,
        scorer: AsyncScorer,
        probe: ProbeClient | None = None,
        store: StoreClient | None = None,
        max_context: int | Callable[[], Awaitable[int]] | None = None,
        record: Callable[..., None] = _no_metrics,
        trace: Any = None,
        offload: Callable[..., Awaitable[Any]] = inline,
        reuse_memo: bool = True,
    ):
        self.target_tokenizer = target_tokenizer
        self.drafter_tokenizer = drafter_tokenizer
        self.scorer = scorer
        self.probe = probe
        self.store = store
        self._max_context = Once(max_context) if callable(max_context) else max_context
        self.record = record
        self.trace = trace
        self.offload = offload
        self._probe_params = Once(probe.params) if probe is not None else None
        self._reading: dict[str, asyncio.Task] = {}  # read-aheads in flight, by conversation
        # what each conversation's turn derived from its unchanged text, for its next turn
        # (off: every turn computes it from scratch, the baseline that reuse must equal)
        self.memo = TurnMemo() if reuse_memo else None

    async def max_context(self) -> int | None:
        """The target's context in tokens; a failed or timed-out fetch is the target's
        stage being unavailable (a 503/504 naming it, with Retry-After)."""
        if not isinstance(self._max_context, Once):
            return self._max_context
        try:
            return int(await self._max_context())
        except Exception as exc:
            raise StageUnavailable("target", unwrap_remote_error(exc)) from None

    # ------------------------------------------------------------------ the flow
    async def run(self, request: CompressionRequest) -> Compressed:
        """Gate → (view) → drafter → select/assemble → context fit; fail closed."""
        pending = await self.start(request)
        return await pending.finish()

    async def start(self, request: CompressionRequest) -> Pending:
        """Plan the request and raise what the client got wrong, before any model runs: an
        explicit query or required string not in the prompt, mandatory parts (or a prompt
        the gate leaves whole) that cannot fit the context with max_tokens."""
        config, prompt = request.config, request.prompt
        request = replace(request, max_context=await self.max_context())
        if config.mode == "off":
            text = prompt.text if request.keep_text else ""
            result = passthrough(prompt.ids, text)
            check_context(result, request)
            return Pending(self, request, served=replace(result, snapshot_cut=prompt.snapshot_cut))
        r0 = configured_keep_ratio(config.gate, len(prompt.ids))
        if config.adaptive_keep and request.session_id and request.keep_ratio is None:
            r0 = await self._store_call(
                "keep_ratio",
                request.conversation,
                r0,
                default=r0,
                timeout_s=config.store_call_timeout_s,
            )
        request = replace(request, r0=r0)
        compression = config.part(CompressionPart)
        prepared = await self.offload(prepare, request, memo=self.memo, **self._kw(compression))
        if not prepared.compress and not self._views_apply(request):
            # the prompt will be served as it is: whether it fits is known now
            check_context(passthrough(prompt.ids, ""), request)
        return Pending(self, request, prepared)

    async def _finish(self, pending: Pending) -> Compressed:
        request, prepared = pending.request, pending.prepared
        assert prepared is not None
        if self._views_apply(request):
            result = await self._serve_view(prepared, request)
            cut = result.snapshot_cut if result.compressed else request.prompt.snapshot_cut
        else:
            result = await self._fresh(prepared, request)
            # the render's cut indexes the raw prompt: only valid when that is served
            cut = None if result.compressed else request.prompt.snapshot_cut
        check_required(result, request.pflash_required)
        check_context(result, request)
        return replace(result, snapshot_cut=cut)

    def _views_apply(self, request: CompressionRequest) -> bool:
        config = request.config
        return (
            self.store is not None
            and request.prompt.kind == "chat"
            and config.chat_view
            and config.strict
        )

    def run_sync(self, request: CompressionRequest) -> Compressed:
        """`run` for callers without an event loop (the CLI, benchmarks, tests). A read-ahead
        the request started runs to its end before this returns (the loop goes with it).

        The result leaves through `out`, not as the task's result: on the main thread
        `asyncio.run` restores the SIGINT handler it installed, and the standard library
        builds the repr of that handler, the finished main task and so its result, on the
        way: the repr of a long prompt's `Compressed` is costly and is built twice a call, while
        returning None costs nothing."""
        out: list[Compressed] = []

        async def run_and_drain() -> None:
            out.append(await self.run(request))
            await self.drain()

        asyncio.run(run_and_drain())
        return out[0]

    async def drain(self) -> None:
        """Wait for the read-aheads in flight (`_read_ahead`)."""
        while self._reading:
            await asyncio.gather(*self._reading.values(), return_exceptions=True)

    async def feedback(
        self,
        compressed: Compressed,
        config: PFlashConfig,
        session: str | None,
        accept_rate: float | None,
    ) -> None:
        """Speculative-decoding acceptance moves the session's adaptive keep ratio (§6.6):
        lower acceptance reads as lost context, so the next turn keeps more."""
        if not session or accept_rate is None or not compressed.compressed:
            return
        if not config.adaptive_keep:
            return
        r0 = configured_keep_ratio(config.gate, compressed.original_tokens)
        await self._store_call(
            "report_acceptance",
            session,
            accept_rate,
            r0,
            default=None,
            timeout_s=config.store_call_timeout_s,
        )

    def _kw(self, config: CompressionPart) -> dict[str, Any]:
        return {
            "config": config,
            "target_tokenizer": self.target_tokenizer,
            "drafter_tokenizer": self.drafter_tokenizer,
        }

    async def _fresh(self, prepared, request: CompressionRequest) -> Compressed:
        """A fresh compression (the drafter runs), or the prompt as is when the gate declined."""
        config = request.config
        if not prepared.compress:
            self.record("pflash_bypasses", reason=prepared.reason)
            return uncompressed(prepared)
        stage = "drafter"
        await self._after_read_ahead(request.conversation)
        try:
            # one deadline for the scoring calls: a hung replica fails this request (504)
            # instead of holding it until request_timeout_s
            async with asyncio.timeout(config.remote_call_timeout_s):
                called = time.perf_counter()
                probe_wait_ms = 0.0
                response = self.scorer(prepared.score_request, request.conversation)
                boundary = subunit = probe_params = None
                if self.probe is not None and prepared.score_request.want_tap:
                    stage = "probe"  # its parameters do not depend on the drafter
                    try:
                        probe_params = await self._probe_params()
                    except BaseException:
                        _cancel(response)  # nobody will read this drafter pass
                        raise
                    stage = "drafter"
                    try:
                        boundary, subunit = await self.probe.segment(response)
                        probe_wait_ms = ms_since(called)
                    except Exception:
                        # the probe reads the drafter's response: when the drafter failed,
                        # the probe only reports that an input died; the drafter's own error
                        # is the cause (raised here), otherwise the probe itself failed
                        await response
                        stage = "probe"
                        raise
                scores = await response
                drafter_wait_ms = ms_since(called)
            stage = "selection"  # the scores are in: a failure from here on is not the drafter's
            result = await self.offload(
                finish,
                prepared,
                scores,
                trace=self.trace,
                boundary=boundary,
                subunit=subunit,
                probe_params=probe_params,
                memo=self.memo,
                **self._kw(config.part(CompressionPart)),
            )
        except Exception as exc:
            err = unwrap_remote_error(exc)
            stage = err.stage if isinstance(err, CompressionFailed) else stage
            self.record("pflash_errors", stage=stage)
            if scorer_failure_action(stage, config.server) == "bypass":
                log.warning(
                    "drafter failed, serving uncompressed (on_drafter_error=bypass): %s", err
                )
                self.record("pflash_bypasses", reason="drafter_error")
                return uncompressed(prepared)
            if isinstance(err, CompressionFailed):
                raise err from None
            if runtime_failure(err) is not None:  # overload, a lost replica: retryable
                raise StageUnavailable(stage, err) from None
            raise CompressionFailed(stage, f"{type(err).__name__}: {err}") from None
        self.record("pflash_compression_seconds", result.stats.get("compress_ms", 0.0) / 1000.0)
        self.record("pflash_drafter_forward_seconds", scores.scorer_forward_ms / 1000.0)
        waits = {"drafter_wait_ms": drafter_wait_ms, "probe_wait_ms": probe_wait_ms}
        return replace(result, stats={**result.stats, **waits})

    async def _serve_view(self, prepared, request: CompressionRequest) -> Compressed:
        """The multi-turn path (§6.1): look the conversation's view up, decide, run the
        drafter only when the decision needs a fresh compression, remember the new view.
        The result carries the decision's snapshot cut."""
        tenant, config = request.tenant, request.config.part(ViewPart)
        started = time.perf_counter()
        keys = view_keys(prepared, self.target_tokenizer, self.drafter_tokenizer)
        view = await self._store_call(
            "lookup", tenant, keys, default=None, timeout_s=request.config.store_call_timeout_s
        )

        def decide(fresh):
            return decide_view(
                prepared,
                view,
                fresh,
                tenant=tenant,
                conversation=request.conversation,
                now=time.time(),
                **self._kw(config),
            )

        decision = await self.offload(decide, None)
        view_ms = ms_since(started)
        fresh = None
        if decision.needs_compression:
            # new material the view appends is also selected on its own (§6.1 step 9)
            part = replace(prepared, part_begin=decision.part_begin)
            fresh = await self._fresh(part, request)
            decision = await self.offload(decide, fresh)
        if decision.view is not None:
            await self._store_call(
                "remember",
                decision.view,
                default=None,
                timeout_s=request.config.store_call_timeout_s,
            )
        self.record("pflash_view_outcomes", mode=decision.mode)
        if decision.recalled_tokens:
            self.record("pflash_recalled_tokens", decision.recalled_tokens)
        if decision.mode == "rebuild":
            self.record("pflash_rebuilds", reason=decision.reason or "rebuild")
        if fresh is None and decision.mode == "continue":
            self._read_ahead(prepared, request)
        served = served_result(decision, prepared, fresh)
        stats = {**served.stats, "view_ms": view_ms}
        return replace(served, stats=stats, snapshot_cut=decision.snapshot_cut)

    def _read_ahead(self, prepared: Prepared, request: CompressionRequest) -> None:
        """After serving a small addition verbatim (an agent step under
        `chat_compress_new_tokens`, which runs no drafter), score the prompt in the
        background, so the conversation's drafter session and the probe's rows cover it.

        Why: otherwise the next turn that needs the drafter (a question, a large tool output)
        pays for every small addition since the drafter last ran (a cost that grows with
        those tokens; docs/BENCHMARK_NOTEBOOK.md, "Agents"), while the full path prefills only
        the question.
        Read ahead, each step's drafter cost is paid in the background of the step that adds
        it, as the issue's "a step costs what it adds" asks, and the next turn resumes on its
        own tokens. The result is discarded: what is later selected is computed from the
        session exactly as from scratch (sessions only skip recomputing a common prefix).

        Best effort, never in a response's way: one per conversation, at most
        `READ_AHEAD_MAX` in flight per compressor, skipped when either is reached, and a
        failure is logged and counted, not raised (the next turn that needs the drafter
        fails closed on its own)."""
        config, key = request.config, request.conversation
        if not (config.chat_read_ahead and prepared.compress and key):
            return
        if key in self._reading or len(self._reading) >= READ_AHEAD_MAX:
            self.record("pflash_read_aheads", outcome="skipped")
            return
        task = asyncio.get_running_loop().create_task(self._read(prepared, request))
        self._reading[key] = task
        task.add_done_callback(lambda _: self._reading.pop(key, None))

    async def _read(self, prepared: Prepared, request: CompressionRequest) -> None:
        score_request = replace(prepared.score_request, read_ahead=True)
        try:
            async with asyncio.timeout(request.config.remote_call_timeout_s):
                response = self.scorer(score_request, request.conversation)
                if self.probe is not None and score_request.want_tap:
                    await self.probe.segment(response)  # the probe keeps the new rows' logits
                result = await response
        except Exception as exc:
            log.warning("read-ahead failed (the next turn scores these tokens itself): %s", exc)
            self.record("pflash_read_aheads", outcome="failed")
            return
        self.record(
            "pflash_read_aheads", outcome="skipped" if is_skipped_read_ahead(result) else "done"
        )

    async def _after_read_ahead(self, conversation: str) -> None:
        """Let this conversation's read-ahead in flight finish first: this turn resumes the
        session it leaves (and would otherwise race it for the drafter)."""
        reading = self._reading.get(conversation)
        if reading is not None:
            await asyncio.wait({reading})

    async def _store_call(
        self, method: str, *args: Any, default: Any, timeout_s: float | None = None
    ) -> Any:
        """Views are a cache: a failed or slow store call (past `timeout_s`,
        `store_call_timeout_s`) means "no view", never a failed request."""
        if self.store is None:
            return default
        try:
            async with asyncio.timeout(timeout_s):
                return await getattr(self.store, method)(*args)
        except Exception as exc:
            log.warning("session store %s failed (%s); continuing without it", method, exc)
            return default
