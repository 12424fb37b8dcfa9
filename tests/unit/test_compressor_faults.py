"""What the compression flow answers when a remote part fails: which stage it names, whether
the client may retry, and that nothing asked to compress is served uncompressed.

The drafter and probe here are stand-ins that fail the way Ray's do (matched by class name,
as the flow matches them); the tokenizer, rendering and planning are the real ones.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pflash.compress.scoring import ScoreResult
from pflash.config import build_config
from pflash.errors import CompressionFailed, StageUnavailable
from pflash.flow.compressor import Compressor
from pflash.flow.in_process import LocalStore
from pflash.flow.parts import Once
from pflash.flow.request import compression_request, render_request
from pflash.serving.admission import request_params
from pflash.serving.chat_completion.serving import parse_chat_request
from pflash.serving.envelope import error_response, public_message
from pflash.views.store import ViewStore

sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures"))
from serve_cancellation import REQUEST, RemoteCalls  # noqa: E402

DOCUMENT = " ".join(f"Clause {i} says the licensee keeps the notice intact." for i in range(300))


class ActorDiedError(Exception):
    """Stands in for ray.exceptions.ActorDiedError, a RayActorError."""


class RayActorError(Exception):
    pass


class DrafterDied(ActorDiedError, RayActorError):
    pass


class RayServeException(Exception):
    """What a replica reports when one of its inputs came from an actor that died."""


class BackPressureError(Exception):
    pass


def _failing_scorer(exc: Exception):
    def score(request, conversation):
        future = asyncio.get_running_loop().create_future()
        future.set_exception(exc)
        return future

    return score


class _ProbeOfADeadInput:
    """A probe replica whose input (the drafter's response) never arrived."""

    async def params(self):
        return None

    async def segment(self, scored):
        try:
            await scored
        except Exception:
            raise RayServeException(
                "an upstream actor died before finishing a dependent task"
            ) from None
        raise AssertionError("unreachable in these tests")


def _run(scorer, probe, tokenizer, store=None, **overrides):
    config = build_config({"mode": "always", "select_segments": "probe", **overrides}, env={})
    compressor = Compressor(
        target_tokenizer=tokenizer,
        drafter_tokenizer=tokenizer,
        scorer=scorer,
        probe=probe,
        store=store or LocalStore(ViewStore.from_config(config)),
        max_context=8192,
    )
    req = parse_chat_request(
        {
            "messages": [
                {"role": "user", "content": DOCUMENT + "\n\nWhat must the licensee keep?"}
            ],
            "max_tokens": 64,
        }
    )
    prompt = render_request(req, "chat", tokenizer)
    return compressor.run_sync(
        compression_request(req, prompt, config, "anonymous", request_params(req, config))
    )


def test_a_dead_drafter_behind_the_probe_is_reported_as_the_drafter_and_retryable(
    smollm2_tokenizer,
):
    with pytest.raises(StageUnavailable) as info:
        _run(
            _failing_scorer(DrafterDied("actor 4f2a died")), _ProbeOfADeadInput(), smollm2_tokenizer
        )
    status, body = error_response(info.value)
    assert info.value.stage == "drafter"
    assert status == 503 and body["error"]["code"] == "pflash_drafter_replica_unavailable"


def test_an_overloaded_drafter_is_a_503_not_a_500(smollm2_tokenizer):
    with pytest.raises(StageUnavailable) as info:
        _run(_failing_scorer(BackPressureError("queue full")), None, smollm2_tokenizer)
    assert error_response(info.value)[0] == 503
    assert info.value.code == "pflash_drafter_backpressure"


def _ray_transients():
    """Ray's own transient failures, as Ray raises them (the real classes)."""
    from ray import exceptions as rx

    ref = "ab" * 14
    return [
        rx.ObjectLostError(ref, None, ""),
        rx.OwnerDiedError(ref, None, ""),
        rx.ObjectFetchTimedOutError(ref, None, ""),
        rx.WorkerCrashedError(),
        rx.NodeDiedError("node 10.0.0.7 died"),
        rx.LocalRayletDiedError(),
        rx.RaySystemError("object store connection closed"),
        rx.ObjectStoreFullError("object store full"),
        rx.PendingCallsLimitExceeded("too many pending calls"),
        rx.OutOfMemoryError("the memory monitor killed the worker"),
        rx.ActorUnavailableError("actor restarting", None),
        rx.GetTimeoutError("get timed out"),
    ]


@pytest.mark.parametrize("exc", _ray_transients(), ids=lambda e: type(e).__name__)
def test_a_transient_ray_failure_at_the_drafter_is_retryable_not_a_500(smollm2_tokenizer, exc):
    with pytest.raises(StageUnavailable) as info:
        _run(_failing_scorer(exc), None, smollm2_tokenizer)
    status, body = error_response(info.value)
    assert status in (503, 504) and info.value.stage == "drafter"
    assert body["error"]["code"].startswith("pflash_drafter_")
    assert "ab" * 14 not in public_message(info.value)  # the runtime's ids stay inside


@pytest.mark.parametrize("exc", _ray_transients(), ids=lambda e: type(e).__name__)
def test_a_transient_ray_failure_anywhere_else_is_a_503_or_504_in_the_envelope(exc):
    status, body = error_response(exc)
    assert status in (503, 504)
    assert body["error"]["type"] in ("service_unavailable", "overloaded_error", "timeout_error")
    assert "ab" * 14 not in public_message(exc)


def test_a_drafter_bug_stays_a_500_naming_the_drafter(smollm2_tokenizer):
    with pytest.raises(CompressionFailed) as info:
        _run(_failing_scorer(KeyError("tap")), None, smollm2_tokenizer)
    assert not isinstance(info.value, StageUnavailable)
    assert info.value.stage == "drafter" and error_response(info.value)[0] == 500


def test_a_dead_drafter_is_served_uncompressed_only_when_the_operator_chose_bypass(
    smollm2_tokenizer,
):
    result = _run(
        _failing_scorer(DrafterDied("died")),
        _ProbeOfADeadInput(),
        smollm2_tokenizer,
        on_drafter_error="bypass",
    )
    assert result.stats["keep_ratio"] == 1.0


def _hanging_scorer():
    def score(request, conversation):
        return asyncio.get_running_loop().create_future()  # never resolves

    return score


class _HangingStore:
    async def lookup(self, tenant, keys):
        await asyncio.sleep(3600)


def test_a_hung_drafter_is_a_504_after_the_remote_call_deadline(smollm2_tokenizer):
    started = time.monotonic()
    with pytest.raises(StageUnavailable) as info:
        _run(_hanging_scorer(), None, smollm2_tokenizer, remote_call_timeout_s=0.3)
    assert time.monotonic() - started < 10
    assert error_response(info.value)[0] == 504
    assert info.value.code == "pflash_drafter_timeout"


def test_a_hung_session_store_counts_as_no_view_and_the_request_goes_on(smollm2_tokenizer):
    """The drafter fails on purpose: reaching it proves the lookup did not hold the request."""
    started = time.monotonic()
    with pytest.raises(CompressionFailed) as info:
        _run(
            _failing_scorer(KeyError("reached the drafter")),
            None,
            smollm2_tokenizer,
            store=_HangingStore(),
            store_call_timeout_s=1.5,
        )
    assert "reached the drafter" in info.value.message
    assert 1.5 <= time.monotonic() - started < 10  # the lookup ran and was given up on


class _OverloadedProbe:
    """A probe whose queue is full: even its parameters are refused."""

    async def params(self):
        raise BackPressureError("probe queue full")

    async def segment(self, scored):
        raise AssertionError("a probe that refused its parameters is not asked to segment")


def test_a_probe_refusal_is_a_503_at_once_not_after_the_drafter_pass(smollm2_tokenizer):
    """Under a burst the probe's queue can fill while the drafter still holds this request:
    the client is told at once, and the drafter pass nobody will read is cancelled."""
    pending = []

    def score(request, conversation):
        pending.append(asyncio.get_running_loop().create_future())  # a pass that never ends
        return pending[-1]

    started = time.monotonic()
    with pytest.raises(StageUnavailable) as info:
        _run(score, _OverloadedProbe(), smollm2_tokenizer, remote_call_timeout_s=60)
    assert time.monotonic() - started < 10
    assert info.value.code == "pflash_probe_backpressure"
    assert error_response(info.value)[0] == 503
    assert [f.cancelled() for f in pending] == [True]


def test_concurrent_first_callers_share_one_fetch_and_a_failed_fetch_is_retried():
    calls = []

    async def fetch():
        calls.append(len(calls))
        await asyncio.sleep(0.05)
        if len(calls) == 1:
            raise BackPressureError("refused")
        return {"threshold": 0.5}

    once = Once(fetch)

    async def burst():
        return await asyncio.gather(*(once() for _ in range(20)), return_exceptions=True)

    async def main():
        first = await burst()
        second = await burst()
        third = await once()
        return first, second, third

    first, second, third = asyncio.run(main())
    assert all(isinstance(r, BackPressureError) for r in first)  # 20 callers, one refusal
    assert second == [{"threshold": 0.5}] * 20 and third == {"threshold": 0.5}
    assert calls == [0, 1]  # one fetch per burst, none once the value is known


def test_a_shared_fetch_runs_in_no_callers_request_context():
    seen = []

    async def fetch():
        seen.append(REQUEST.get())
        return 8192

    once = Once(fetch)

    async def request(rid):
        REQUEST.set(rid)
        return await once()

    assert asyncio.run(request("req-1")) == 8192
    assert seen == [None]


def test_a_client_that_gives_up_does_not_fail_the_request_sharing_its_fetch():
    """The first request starts the fetch and its client goes away (Serve cancels the request
    and the remote calls made under it); the next request, already waiting on the same
    fetch, gets the value. Before: a cancellation it never asked for, Serve's bare 500."""
    remote = RemoteCalls()
    once = Once(remote.call)

    async def request(rid):
        REQUEST.set(rid)
        return await once()

    async def main():
        first = asyncio.create_task(request("req-1"))
        await asyncio.sleep(0.01)
        second = asyncio.create_task(request("req-2"))
        await asyncio.sleep(0.01)
        first.cancel()  # the proxy cancels the request whose client went away ...
        remote.cancel_request("req-1")  # ... and the replica cancels that request's calls
        await asyncio.sleep(0.01)
        (pending,) = remote.by_request[None]  # the fetch's call belongs to no request
        pending.set_result(8192)
        return await asyncio.gather(first, second, return_exceptions=True)

    first, second = asyncio.run(main())
    assert isinstance(first, asyncio.CancelledError)
    assert second == 8192


def test_a_fetch_cancelled_from_elsewhere_is_a_503_naming_the_target_and_is_retried():
    """A caller that was not cancelled never sees a cancellation: the target's context
    fetch cancelled under it is the target stage unavailable (503, Retry-After); the next
    request fetches again."""
    remote = RemoteCalls()
    results = iter([None, 8192])

    async def fetch():
        value = next(results)
        if value is None:
            await remote.call()  # cancelled below, by something other than the caller
        return value

    compressor = Compressor(
        target_tokenizer=None, drafter_tokenizer=None, scorer=None, max_context=fetch
    )

    async def main():
        waiting = asyncio.create_task(compressor.max_context())
        await asyncio.sleep(0.01)
        remote.by_request[None][0].cancel()
        first = await asyncio.gather(waiting, return_exceptions=True)
        return first[0], await compressor.max_context()

    first, second = asyncio.run(main())
    assert isinstance(first, StageUnavailable) and first.stage == "target"
    assert error_response(first)[0] == 503
    assert second == 8192


def _uniform_scorer(calls=None):
    """A drafter double whose scores are valid (uniform mass): what follows is selection's."""

    def score(request, conversation):
        if calls is not None:
            calls.append(request)
        future = asyncio.get_running_loop().create_future()
        n = len(request.ids)
        future.set_result(ScoreResult(mass=np.full(n, 1.0 / n, dtype=np.float32)))
        return future

    return score


def test_a_selection_bug_is_never_served_uncompressed_under_bypass(smollm2_tokenizer, monkeypatch):
    """`on_drafter_error: bypass` covers the drafter pass only: a failure once the scores are
    in is selection's, a 500 naming it, not an uncompressed prompt labelled a drafter error."""

    def broken_finish(*args, **kwargs):
        raise IndexError("candidate 12 out of range")

    monkeypatch.setattr("pflash.flow.compressor.finish", broken_finish)
    with pytest.raises(CompressionFailed) as info:
        _run(_uniform_scorer(), None, smollm2_tokenizer, on_drafter_error="bypass")
    assert info.value.stage == "selection"
    assert "IndexError" in info.value.message
    assert error_response(info.value)[0] == 500


def test_an_assembly_failure_keeps_its_stage_and_is_not_bypassed(smollm2_tokenizer, monkeypatch):
    def broken_finish(*args, **kwargs):
        raise CompressionFailed("assembly", "selection kept no tokens")

    monkeypatch.setattr("pflash.flow.compressor.finish", broken_finish)
    with pytest.raises(CompressionFailed) as info:
        _run(_uniform_scorer(), None, smollm2_tokenizer, on_drafter_error="bypass")
    assert info.value.stage == "assembly"


def _job(tokenizer, body, **overrides):
    config = build_config({"mode": "always", "select_semantic_weight": 0.0, **overrides}, env={})
    req = parse_chat_request(body)
    prompt = render_request(req, "chat", tokenizer)
    return compression_request(req, prompt, config, "anonymous", request_params(req, config))


def _compressor(tokenizer, scorer, max_context=8192):
    return Compressor(
        target_tokenizer=tokenizer,
        drafter_tokenizer=tokenizer,
        scorer=scorer,
        max_context=max_context,
    )


def test_an_explicit_query_not_in_the_prompt_is_raised_by_planning_before_the_drafter(
    smollm2_tokenizer,
):
    """The ingress awaits `start` before it sends a byte: a client mistake planning finds
    is a 400 there, never an in-band error after a streamed 200."""
    calls = []
    body = {
        "messages": [{"role": "user", "content": DOCUMENT + "\n\nWhat must the licensee keep?"}],
        "pflash_query": "this sentence is nowhere in the prompt",
    }
    compressor = _compressor(smollm2_tokenizer, _uniform_scorer(calls))
    with pytest.raises(CompressionFailed) as info:
        asyncio.run(compressor.start(_job(smollm2_tokenizer, body)))
    assert error_response(info.value)[0] == 400
    assert info.value.code == "pflash_query_mapping" and calls == []


def test_mandatory_parts_over_the_context_are_raised_by_planning(smollm2_tokenizer):
    body = {
        "messages": [{"role": "user", "content": DOCUMENT + "\n\nWhat must the licensee keep?"}],
        "max_tokens": 4000,
    }
    compressor = _compressor(smollm2_tokenizer, _uniform_scorer(), max_context=4000)
    with pytest.raises(CompressionFailed) as info:
        asyncio.run(compressor.start(_job(smollm2_tokenizer, body)))
    assert error_response(info.value)[0] == 400
    assert (info.value.stage, info.value.param) == ("context_fit", "max_tokens")


def test_planning_returns_without_waiting_for_the_drafter(smollm2_tokenizer):
    """A slow drafter is what the stream's keep-alives cover; planning does not wait on it."""
    body = {
        "messages": [{"role": "user", "content": DOCUMENT + "\n\nWhat must the licensee keep?"}]
    }
    compressor = _compressor(smollm2_tokenizer, _hanging_scorer())
    job = _job(smollm2_tokenizer, body, remote_call_timeout_s=0.3)

    async def main():
        pending = await asyncio.wait_for(compressor.start(job), 30)
        assert pending.prepared is not None and pending.prepared.compress
        with pytest.raises(StageUnavailable) as info:
            await pending.finish()
        return info.value

    assert asyncio.run(main()).code == "pflash_drafter_timeout"


def test_a_target_that_cannot_tell_its_context_is_a_503_naming_the_target():
    """`/v1/models` and every request ask the target's context once: a dead target is a
    retryable 503 in the envelope, not a plain 500."""

    async def context():
        raise DrafterDied("target actor died")

    compressor = Compressor(
        target_tokenizer=None, drafter_tokenizer=None, scorer=None, max_context=context
    )
    with pytest.raises(StageUnavailable) as info:
        asyncio.run(compressor.max_context())
    assert info.value.stage == "target"
    assert error_response(info.value)[0] == 503
    assert info.value.code == "pflash_target_replica_unavailable"
