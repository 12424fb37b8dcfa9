"""The shipped app under load and under faults: every request ends, none is served wrongly.

One cluster from `serve_config.yaml` as shipped (the product's default scorer, all four
deployments and the SessionStore actor), with a smaller drafter queue so that overload is
reached with few requests on 2 cores. Every request asks for compression
(`pflash_mode: always`), so an answer served without it would show as `keep_ratio == 1`.

- load: 50 concurrent long prompts; each is served compressed or refused with a 503 in the
  OpenAI envelope carrying `Retry-After`; none hangs; the app serves again afterwards.
- hangs: a replica stopped with SIGSTOP (alive, never answering) fails the requests sent
  to it with a 504 naming the stage once `remote_call_timeout_s` has passed.
- faults: a replica of each deployment (and the SessionStore actor) is SIGKILLed while
  requests are in flight, the way the kernel's OOM killer ends a process. Those requests
  end with a compressed answer or an envelope error; a new request succeeds once Serve has
  restarted the replica. The printed recovery times are measurements, not assertions.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import time
from pathlib import Path

import httpx
import pytest
import yaml

from pflash.bench.launch import ServeCluster, free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
LICENSE = Path("/usr/share/common-licenses/GPL-3").read_text()
DRAFTER_QUEUE = 6  # DrafterScorer max_queued_requests here: 50 requests must overflow it
CONCURRENT = 50
HANG_S = 600.0  # a request still open after this is a hang
CALL_DEADLINE_S = 45.0  # remote_call_timeout_s here: above the load test's slowest request


def _config(tmp: Path, port: int) -> Path:
    base = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    base["http_options"]["port"] = port
    app = base["applications"][0]
    app["args"]["remote_call_timeout_s"] = CALL_DEADLINE_S
    for dep in app["deployments"]:
        if dep["name"] == "DrafterScorer":
            dep["max_queued_requests"] = DRAFTER_QUEUE
    path = tmp / "serve_config.yaml"
    path.write_text(yaml.safe_dump(base, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("faults")
    port = free_port()
    cluster = ServeCluster(_config(tmp, port), tmp)
    url = f"http://127.0.0.1:{port}"
    try:
        cluster.start(f"{url}/v1/completions", {"prompt": "Hi", "max_tokens": 1})
        yield url
    finally:
        cluster.stop()


def _body(i: int, chars: int = 7000) -> dict:
    """A ~1.6K-token chat over a different stretch of real text per request."""
    start = (i * 997) % (len(LICENSE) - chars)
    text = LICENSE[start : start + chars]
    return {
        "messages": [{"role": "user", "content": f"{text}\n\nWhat does this text require?"}],
        "max_tokens": 4,
        "temperature": 0,
        "pflash_mode": "always",
    }


async def _post(http: httpx.AsyncClient, url: str, body: dict) -> tuple[httpx.Response, float]:
    started = time.perf_counter()
    r = await asyncio.wait_for(http.post(f"{url}/v1/chat/completions", json=body), HANG_S)
    return r, time.perf_counter() - started


def _burst(url: str, bodies: list[dict], *, during=None) -> list[tuple[httpx.Response, float]]:
    """POST every body at once (and run `during()` in a thread meanwhile)."""

    async def run():
        limits = httpx.Limits(max_connections=len(bodies) + 4)
        async with httpx.AsyncClient(timeout=HANG_S, limits=limits) as http:
            posts = asyncio.gather(*(_post(http, url, b) for b in bodies))
            if during is not None:
                await asyncio.to_thread(during)
            return await posts

    return asyncio.run(run())


def _check_answer_or_envelope(r: httpx.Response) -> str:
    """A compressed 200, or an error in the OpenAI envelope; a 5xx says when to retry."""
    if r.status_code == 200:
        stats = r.json()["usage"]["timings"]["pflash"]
        assert stats["keep_ratio"] < 1.0, f"asked to compress, served uncompressed: {stats}"
        return "200"
    error = r.json()["error"]  # the envelope, never a bare body
    assert error["message"] and error["type"], r.text
    assert r.status_code in (503, 504), r.text  # a lost replica is retryable, not a 500
    assert int(r.headers["retry-after"]) >= 1, dict(r.headers)
    assert r.headers.get("x-request-id"), dict(r.headers)
    return f"{r.status_code} {error['code']}"


# ----------------------------------------------------------------------------- load


def test_fifty_concurrent_long_prompts_are_each_served_or_refused_with_retry_after(app):
    results = _burst(app, [_body(i) for i in range(CONCURRENT)])
    outcomes = [_check_answer_or_envelope(r) for r, _ in results]
    served = [s for (r, s) in results if r.status_code == 200]
    refused = [s for (r, s) in results if r.status_code == 503]
    assert len(served) + len(refused) == CONCURRENT, sorted(set(outcomes))
    assert served, "overload refused every request"
    assert refused, "50 concurrent requests never reached the drafter's queue limit"
    assert max(refused) < min(served) + 30, "a refusal waited as long as a served request"
    p = statistics.quantiles(served, n=100) if len(served) > 1 else served * 99
    print(
        f"\nload: {len(served)} served (p50 {statistics.median(served):.1f} s, p99 {p[98]:.1f} s),"
        f" {len(refused)} refused with 503 ({len(refused) / CONCURRENT:.0%}, median "
        f"{statistics.median(refused):.2f} s)"
    )
    r, _ = _burst(app, [_body(999)])[0]
    assert _check_answer_or_envelope(r) == "200"  # the app serves again once the load is gone


# ----------------------------------------------------------------------------- faults


def _replica_pids(deployment: str) -> list[int]:
    """Worker processes whose title names the replica (Ray sets `ray::ServeReplica:app:name`)."""
    needle = f"ServeReplica:pflash:{deployment}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def _actor_pids(actor_class: str) -> list[int]:
    needle = f"ray::{actor_class}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes().startswith(needle):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def _kill(pids: list[int]) -> None:
    assert pids, "nothing to kill"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)


def _recovery_s(app: str, killed_at: float, body: dict, limit_s: float = 240.0):
    """(seconds from the kill until a compressed request succeeds again, that request's own
    latency, how many requests were refused before it)."""
    refused = 0
    while time.monotonic() - killed_at < limit_s:
        r, took = _burst(app, [body])[0]
        if _check_answer_or_envelope(r) == "200":
            return time.monotonic() - killed_at, took, refused
        refused += 1
        time.sleep(1.0)
    pytest.fail(f"no successful request within {limit_s:.0f} s of the kill")


@pytest.mark.parametrize(
    "victim",
    ["DrafterScorer", "SegmentProbe", "TargetModel", "SessionStoreActor"],
)
def test_a_replica_killed_under_load_fails_its_requests_cleanly_and_comes_back(app, victim):
    find = _actor_pids if victim == "SessionStoreActor" else _replica_pids
    before = find(victim)
    assert before, f"no {victim} process found"
    killed_at = 0.0

    def kill_soon():
        nonlocal killed_at
        time.sleep(1.5)  # the requests are in the drafter or the target by now
        _kill(before)
        killed_at = time.monotonic()

    results = _burst(app, [_body(100 + i) for i in range(4)], during=kill_soon)
    outcomes = sorted(_check_answer_or_envelope(r) for r, _ in results)
    recovery, took, refused = _recovery_s(app, killed_at, _body(200))
    print(
        f"\n{victim} killed: in-flight {outcomes}; a request succeeded {recovery:.1f} s after"
        f" the kill (its own latency {took:.1f} s; {refused} refused before it)"
    )


@pytest.mark.parametrize(
    ("victim", "code"),
    [("DrafterScorer", "pflash_drafter_timeout"), ("TargetModel", "pflash_target_timeout")],
)
def test_a_hung_replica_is_a_504_naming_its_stage_after_the_call_deadline(app, victim, code):
    pids = _replica_pids(victim)
    assert pids, f"no {victim} process found"
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        r, took = _burst(app, [_body(300)])[0]
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    assert r.status_code == 504, r.text
    assert r.json()["error"]["code"] == code
    assert int(r.headers["retry-after"]) >= 1
    assert CALL_DEADLINE_S - 1 <= took < CALL_DEADLINE_S + 30, took
    recovery, _, _ = _recovery_s(app, time.monotonic(), _body(301))
    print(f"\n{victim} hung: 504 after {took:.1f} s; serving again {recovery:.1f} s after SIGCONT")
