"""/readyz from a cache: fresh answers make ready, old or missing ones do not, and the
deployments are asked once per interval whatever the number of probes."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from pflash.serving.readiness import CheckState, ReadinessCache, readiness_answer

sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures"))
from serve_cancellation import REQUEST, RemoteCalls  # noqa: E402


def test_ready_when_every_deployment_answered_within_max_age():
    states = {"target": CheckState(100.0), "drafter": CheckState(95.0, "TimeoutError")}
    status, body = readiness_answer(states, now=110.0, max_age_s=15.0)
    assert (status, body) == (200, {"status": "ready", "checks": {"target": "ok", "drafter": "ok"}})


def test_an_answer_older_than_max_age_is_not_ready_and_named():
    states = {"target": CheckState(100.0), "drafter": CheckState(94.0)}
    status, body = readiness_answer(states, now=110.0, max_age_s=15.0)
    assert status == 503
    assert body["checks"] == {"target": "ok", "drafter": "unavailable"}
    assert body["error"]["message"] == "not ready: drafter"
    assert body["error"]["code"] == "not_ready"


def test_a_deployment_never_heard_from_is_not_ready():
    status, body = readiness_answer({"target": CheckState()}, now=0.0, max_age_s=15.0)
    assert status == 503 and body["checks"] == {"target": "unavailable"}
    assert readiness_answer({}, now=0.0)[0] == 503


class Deployment:
    """A check that counts its calls and answers after `delay_s` (or raises)."""

    def __init__(self, delay_s: float = 0.0, fail: bool = False):
        self.calls, self.delay_s, self.fail = 0, delay_s, fail

    async def __call__(self) -> str:
        self.calls += 1
        await asyncio.sleep(self.delay_s)
        if self.fail:
            raise ConnectionError("replica died")
        return "ok"


def test_a_flood_of_probes_asks_each_deployment_once_per_interval():
    target, drafter = Deployment(0.01), Deployment(0.01)

    async def flood():
        cache = ReadinessCache({"target": target, "drafter": drafter}, interval_s=0.3)
        first = await asyncio.gather(*(cache.answer() for _ in range(500)))
        later = await asyncio.gather(*(cache.answer() for _ in range(500)))
        calls_now = (target.calls, drafter.calls)
        await asyncio.sleep(0.45)  # one more interval: one more round
        calls_after = (target.calls, drafter.calls)
        cache.close()
        return first, later, calls_now, calls_after

    first, later, calls_now, calls_after = asyncio.run(flood())
    assert {a[0] for a in first + later} == {200}
    assert calls_now == (1, 1)
    assert calls_after == (2, 2)


def test_a_hung_deployment_is_unavailable_after_its_timeout_and_the_others_stay_ok():
    async def probe():
        cache = ReadinessCache(
            {"target": Deployment(), "drafter": Deployment(delay_s=60)},
            interval_s=10,
            timeout_s=0.1,
            max_age_s=1.0,
        )
        started = asyncio.get_running_loop().time()
        answer = await cache.answer()
        waited = asyncio.get_running_loop().time() - started
        cache.close()
        return answer, waited, cache.states["drafter"]

    (status, body), waited, drafter = asyncio.run(probe())
    assert status == 503 and body["checks"] == {"target": "ok", "drafter": "unavailable"}
    assert waited < 1.0
    assert drafter == CheckState(None, "TimeoutError")


def test_one_failed_check_keeps_ready_until_the_last_answer_ages_out():
    clock = [100.0]
    target = Deployment()

    async def run():
        cache = ReadinessCache({"target": target}, max_age_s=15.0, clock=lambda: clock[0])
        await cache.refresh()
        target.fail = True
        clock[0] = 105.0
        await cache.refresh()
        after_one_failure = await cache.answer()
        clock[0] = 116.0
        aged = await cache.answer()
        cache.close()
        return after_one_failure, aged, cache.states["target"]

    after_one_failure, aged, state = asyncio.run(run())
    assert after_one_failure[0] == 200
    assert aged[0] == 503 and aged[1]["checks"] == {"target": "unavailable"}
    assert state == CheckState(100.0, "ConnectionError")


def test_a_stopped_refresher_is_restarted_by_the_next_probe():
    target = Deployment()

    async def run():
        cache = ReadinessCache({"target": target}, interval_s=10)
        await cache.answer()
        cache.close()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        await cache.answer()
        await asyncio.sleep(0.05)
        cache.close()
        return target.calls

    assert asyncio.run(run()) == 2


def test_a_probe_that_gives_up_does_not_stop_the_checks_it_started():
    """The first probe starts the refresher; its client gives up during the first round
    (a deployment still loading) and Serve cancels that probe's remote calls. The checks
    belong to no probe: they go on, and the next probe is answered from them."""
    remote = RemoteCalls()

    async def run():
        cache = ReadinessCache({"target": remote.call}, interval_s=10)

        async def probe(rid):
            REQUEST.set(rid)
            return await cache.answer()

        first = asyncio.create_task(probe("probe-1"))
        await asyncio.sleep(0.01)
        refresher = cache._task
        first.cancel()  # the probe's client went away ...
        remote.cancel_request("probe-1")  # ... and the replica cancels that probe's calls
        await asyncio.sleep(0.01)
        (check,) = remote.by_request[None]  # the check was made by no probe
        check.set_result("ok")
        second = await probe("probe-2")
        same = cache._task is refresher and not refresher.done()
        cache.close()
        return second, same

    second, same = asyncio.run(run())
    assert second[0] == 200 and second[1]["checks"] == {"target": "ok"}
    assert same  # still the first refresher: nothing stopped it


def test_a_check_cancelled_from_elsewhere_is_a_failed_check_and_the_refresher_goes_on():
    remote = RemoteCalls()
    answers = iter(["cancelled", "ok"])

    async def check():
        if next(answers) == "cancelled":
            return await remote.call()  # cancelled below by the runtime, not the refresher
        return "ok"

    async def run():
        cache = ReadinessCache({"target": check}, interval_s=0.05)
        answering = asyncio.create_task(cache.answer())
        await asyncio.sleep(0.01)
        remote.by_request[None][0].cancel()
        first = await answering
        state = cache.states["target"]
        await asyncio.sleep(0.1)  # the next round
        second = await cache.answer()
        cache.close()
        return first, state, second

    first, state, second = asyncio.run(run())
    assert first[0] == 503 and state == CheckState(None, "CheckCancelled")
    assert second[0] == 200
