"""A real Prometheus scrapes a running PFlash app: the pipeline the KubeRay PodMonitor builds.

Ray is started with `ray start --head` so the metrics export port can be pinned (`serve
run` alone would pick a random one), and the app is deployed on it with `serve run
--address`. Every port is a free one: other test runs may share this machine, and port
numbers inside Ray's worker range (10002-19999) collide with workers. Ray's temp dir is a
private one as well, so this cluster's `ray_current_cluster` file cannot attract another
process's `ray.init()`. Prometheus (Debian's binary) scrapes the metrics port every second.
Every wait is bounded, and everything started here is stopped by process group, never by
name.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from pflash_lab.bench.launch import alive, descendants, free_ports, group_members, stop_group

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
BUDGET_S = 300.0  # the whole module: start, requests, scrapes (a hang guard, not a timing)
LONG_TEXT = Path("/usr/share/common-licenses/GPL-3")

# Declared pflash counters that these requests cannot fire: the current app does not
# record view decisions yet (no multi-turn view code in deployments/). They are allowed
# to be missing from the running app only because they are declared in pflash/serving/metrics.py;
# every other dashboard series must be present.
NOT_FIRED_HERE = frozenset(
    {
        "ray_pflash_view_outcomes_total",
        "ray_pflash_recalled_tokens_total",
        "ray_pflash_rebuilds_total",
        "ray_pflash_read_aheads_total",  # fired only by a small agent step appended verbatim
        "ray_pflash_tools_not_offered_total",  # fired only by a hosted tool (web_search, ...)
    }
)


def _manifest_checks():
    """PromQL helpers shared with the unit test (one implementation of the name parser)."""
    path = ROOT / "tests" / "unit" / "test_k8s_manifests.py"
    spec = importlib.util.spec_from_file_location("k8s_manifest_checks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Stack:
    app: str  # http://127.0.0.1:<serve port>
    metrics: str  # Ray's metrics endpoint
    prometheus: str  # Prometheus' HTTP API base
    deadline: float  # time.monotonic() by which every wait must be over


def _prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if not found:
        pytest.fail(
            "Prometheus is not installed; install Debian's package: "
            "apt-get update && apt-get install -y prometheus"
        )
    return found


def _wait(what: str, probe, deadline: float, logs: list[Path]):
    """Poll `probe()` every 0.5 s until it returns a truthy value or `deadline` passes."""
    while time.monotonic() < deadline:
        try:
            result = probe()
            if result:
                return result
        except (httpx.HTTPError, OSError):
            pass
        time.sleep(0.5)
    tails = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in logs if p.exists())
    pytest.fail(f"timed out waiting for {what}\n{tails}")


@pytest.fixture(scope="module")
def stack():
    prometheus_bin = _prometheus_binary()
    deadline = time.monotonic() + BUDGET_S
    work = Path(tempfile.mkdtemp(prefix="pfp", dir="/tmp"))  # short: Ray socket paths
    names = ("gcs", "metrics", "serve", "prom", "agent", "grpc", "env", "dash")
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_metrics_report_interval_ms": "1000",
        "PYTHONPATH": str(ROOT),
        "TOKENIZERS_PARALLELISM": "false",
    }
    cfg = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    cfg["http_options"]["port"] = ports["serve"]
    (work / "serve_config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    (work / "prometheus.yml").write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "ray",
                        "static_configs": [{"targets": [f"127.0.0.1:{ports['metrics']}"]}],
                    }
                ],
            }
        )
    )
    logs = [work / "prometheus.log", work / "ray_start.log", work / "serve.log"]
    procs: list[tuple[subprocess.Popen, float]] = []  # (process, grace seconds), start order
    log_files = []
    ray_root_pids: set[int] = set()

    def spawn(args: list[str], log: Path, grace_s: float) -> subprocess.Popen:
        log_files.append(log.open("w"))
        proc = subprocess.Popen(
            args,
            cwd=ROOT,
            env=env,
            stdout=log_files[-1],
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        procs.append((proc, grace_s))
        return proc

    try:
        spawn(
            [
                prometheus_bin,
                f"--config.file={work / 'prometheus.yml'}",
                f"--storage.tsdb.path={work / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{ports['prom']}",
            ],
            logs[0],
            5,
        )
        ray_start = spawn(
            [
                str(BIN / "ray"),
                "start",
                "--head",
                "--num-cpus=2",
                f"--port={ports['gcs']}",
                f"--metrics-export-port={ports['metrics']}",
                f"--dashboard-agent-listen-port={ports['agent']}",
                f"--dashboard-agent-grpc-port={ports['grpc']}",
                f"--runtime-env-agent-port={ports['env']}",
                f"--dashboard-port={ports['dash']}",
                "--include-dashboard=false",
                "--disable-usage-stats",
                f"--temp-dir={work / 'ray'}",
            ],
            logs[1],
            5,
        )
        # `ray start` returns once the head is up; its daemons stay in its process group.
        _wait("ray start", lambda: ray_start.poll() is not None, deadline, logs)
        assert ray_start.returncode == 0, logs[1].read_text()[-3000:]
        ray_root_pids = group_members(ray_start.pid)
        spawn(
            [
                str(BIN / "serve"),
                "run",
                "--address",
                f"127.0.0.1:{ports['gcs']}",
                str(work / "serve_config.yaml"),
            ],
            logs[2],
            10,
        )
        app = f"http://127.0.0.1:{ports['serve']}"
        prom = f"http://127.0.0.1:{ports['prom']}"
        _wait("the app", lambda: httpx.get(f"{app}/healthz", timeout=5).is_success, deadline, logs)
        _wait(
            "Prometheus", lambda: httpx.get(f"{prom}/-/ready", timeout=5).is_success, deadline, logs
        )
        yield Stack(app, f"http://127.0.0.1:{ports['metrics']}/metrics", prom, deadline)
    finally:
        # Ray workers run in their own process groups under the raylet: note their ids
        # before the raylet goes, and kill any that outlive it.
        workers = descendants(ray_root_pids)
        for proc, grace_s in reversed(procs):
            stop_group(proc, grace_s)
        for pid in workers:
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for f in log_files:
            f.close()
        shutil.rmtree(work, ignore_errors=True)


def _query(stack: Stack, promql: str) -> list[dict]:
    r = httpx.get(f"{stack.prometheus}/api/v1/query", params={"query": promql}, timeout=10)
    body = r.json()
    assert body["status"] == "success", (promql, body)
    return body["data"]["result"]


def _by_label(results: list[dict], label: str) -> dict[str, float]:
    return {r["metric"].get(label, ""): float(r["value"][1]) for r in results}


@pytest.fixture(scope="module")
def scraped(stack):
    """Send one compressed, one uncompressed and one invalid request; wait for Prometheus."""
    document = LONG_TEXT.read_text()[:4500]  # ~1K SmolLM2 tokens
    compressed = httpx.post(
        f"{stack.app}/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": document + "\n\nWhat is this text about?"}],
            "max_tokens": 4,
            "temperature": 0,
            "pflash_mode": "always",
        },
        timeout=max(5.0, stack.deadline - time.monotonic()),
    )
    assert compressed.status_code == 200, compressed.text
    stats = compressed.json()["usage"]["timings"]["pflash"]
    assert stats["drafter_input_tokens"] > 900 and stats["keep_ratio"] < 0.5
    full = httpx.post(
        f"{stack.app}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4},
        timeout=60,
    )
    assert full.status_code == 200 and full.json()["usage"]["timings"]["pflash"]["keep_ratio"] == 1
    invalid = httpx.post(f"{stack.app}/v1/chat/completions", json={"messages": []}, timeout=30)
    assert invalid.status_code == 400

    def counts():
        requests = _by_label(
            _query(stack, "sum by (compressed) (ray_pflash_requests_total)"), "compressed"
        )
        compressions = _query(stack, "sum(ray_pflash_compression_seconds_count)")
        # Each actor reports its own counters on its own cycle: the ingress's error counter
        # can reach Prometheus a scrape after the request counters.
        errors = _query(stack, "sum(ray_pflash_errors_total)")
        done = requests == {"true": 1.0, "false": 1.0} and compressions and errors
        return (requests, float(compressions[0]["value"][1])) if done else None

    return _wait("Prometheus to see both requests and the error", counts, stack.deadline, [])


def test_prometheus_counts_requests_by_compressed_label(scraped):
    requests, compressions = scraped
    assert requests == {"true": 1.0, "false": 1.0}
    assert compressions >= 1


def test_prometheus_sees_the_bypass_and_the_request_error(stack, scraped):
    bypasses = _by_label(_query(stack, "sum by (reason) (ray_pflash_bypasses_total)"), "reason")
    errors = _by_label(_query(stack, "sum by (stage) (ray_pflash_errors_total)"), "stage")
    assert sum(bypasses.values()) == 1.0  # the short auto-mode prompt was served uncompressed
    assert errors == {"request": 1.0}


def test_dashboard_names_only_series_the_running_app_exports(stack, scraped):
    checks = _manifest_checks()
    dashboard = checks.load_dashboard()
    used = set().union(*(checks.promql_names(e)[0] for e in checks.dashboard_exprs(dashboard)))
    text = httpx.get(stack.metrics, timeout=10).text
    exported = set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{| )", text, re.M))
    names = httpx.get(f"{stack.prometheus}/api/v1/label/__name__/values", timeout=10).json()
    exported |= set(names["data"])  # everything Prometheus scraped from that endpoint so far
    assert NOT_FIRED_HERE <= checks.pflash_exported_names()
    assert used - exported <= NOT_FIRED_HERE, sorted(used - exported - NOT_FIRED_HERE)
    assert {"ray_pflash_ttft_seconds_bucket", "ray_serve_num_http_requests_total"} <= exported


def test_every_dashboard_query_runs_in_prometheus(stack, scraped):
    checks = _manifest_checks()
    for expr in checks.dashboard_exprs(checks.load_dashboard()):
        _query(stack, expr.replace("$__rate_interval", "1m"))  # asserts status == success
    ttft = (
        "histogram_quantile(0.95, sum by (le, compressed) "
        "(rate(ray_pflash_ttft_seconds_bucket[1m])))"
    )

    def ttft_labels():
        labels = set(_by_label(_query(stack, ttft), "compressed"))
        return labels if labels == {"true", "false"} else None

    assert _wait("the TTFT panel's two series", ttft_labels, stack.deadline, []) == {
        "true",
        "false",
    }
