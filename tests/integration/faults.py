"""Requests against a running app while its parts fail, and finding the parts to fail.

Shared by the load/fault tests and the two-node test: a burst of concurrent requests (with
something done meanwhile), the check every answer must pass (a compressed 200, or an error
in the OpenAI envelope that says when to retry), and the processes that run each replica.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
import yaml

from pflash_lab.bench import launch

ROOT = Path(__file__).resolve().parents[2]
LICENSE = Path("/usr/share/common-licenses/GPL-3").read_text()
HANG_S = 600.0  # a request still open after this is a hang


def body(i: int, chars: int = 7000) -> dict:
    """A ~1.6K-token chat over a different stretch of real text per request."""
    start = (i * 997) % (len(LICENSE) - chars)
    text = LICENSE[start : start + chars]
    return {
        "messages": [{"role": "user", "content": f"{text}\n\nWhat does this text require?"}],
        "max_tokens": 4,
        "temperature": 0,
        "pflash_mode": "always",
    }


async def post(http: httpx.AsyncClient, url: str, body: dict) -> tuple[httpx.Response, float]:
    started = time.perf_counter()
    r = await asyncio.wait_for(http.post(f"{url}/v1/chat/completions", json=body), HANG_S)
    return r, time.perf_counter() - started


def burst(url: str, bodies: list[dict], *, during=None) -> list[tuple[httpx.Response, float]]:
    """POST every body at once (and run `during()` in a thread meanwhile)."""

    async def run():
        limits = httpx.Limits(max_connections=len(bodies) + 4)
        async with httpx.AsyncClient(timeout=HANG_S, limits=limits) as http:
            posts = asyncio.gather(*(post(http, url, b) for b in bodies))
            if during is not None:
                await asyncio.to_thread(during)
            return await posts

    return asyncio.run(run())


def answer_or_envelope(r: httpx.Response) -> str:
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


def _titled(match) -> list[int]:
    """Processes of the clusters this test process started (`launch.LIVE`) whose title
    `match`es: a machine-wide search also found, and killed, the replicas of a benchmark or
    another test's app running beside the suite."""
    ours = set().union(*(cluster.own_processes() for cluster in launch.LIVE))
    pids = []
    for pid in sorted(ours):
        try:
            if match((Path("/proc") / str(pid) / "cmdline").read_bytes()):
                pids.append(pid)
        except OSError:
            continue
    return pids


def replica_pids(deployment: str, app: str = "pflash") -> list[int]:
    """Worker processes whose title names the replica (Ray sets `ray::ServeReplica:app:name`)."""
    needle = f"ServeReplica:{app}:{deployment}".encode()
    return _titled(lambda cmdline: needle in cmdline)


def actor_pids(actor_class: str) -> list[int]:
    needle = f"ray::{actor_class}".encode()
    return _titled(lambda cmdline: cmdline.startswith(needle))


def kill(pids: list[int]) -> None:
    assert pids, "nothing to kill"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)


def recovery(app: str, killed_at: float, body: dict, limit_s: float = 240.0):
    """(seconds from the kill until a compressed request succeeds again, that request's own
    latency, how many requests were refused before it)."""
    refused = 0
    while time.monotonic() - killed_at < limit_s:
        r, took = burst(app, [body])[0]
        if answer_or_envelope(r) == "200":
            return time.monotonic() - killed_at, took, refused
        refused += 1
        time.sleep(1.0)
    pytest.fail(f"no successful request within {limit_s:.0f} s of the kill")


def write_config(
    tmp: Path, port: int, call_deadline_s: float, edit, args: dict | None = None
) -> Path:
    """serve_config.yaml as shipped, on `port`, with `remote_call_timeout_s`, the app
    `args` given and `edit(deployment)` applied to each deployment's entry; written into
    `tmp`."""
    base = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    base["http_options"]["port"] = port
    app = base["applications"][0]
    app["args"]["remote_call_timeout_s"] = call_deadline_s
    app["args"].update(args or {})
    for dep in app["deployments"]:
        edit(dep)
    path = tmp / "serve_config.yaml"
    path.write_text(yaml.safe_dump(base, sort_keys=False))
    return path
