"""Start the real application the way an operator does (used by the integration tests and
the HTTP benchmarks): a local Ray head with a pinned
metrics port (`ray start --head --block`), then `serve run --address ... CONFIG`.

Everything runs in its own process group and is stopped with SIGTERM (a backgrounded
`serve run` ignores SIGINT), then SIGKILL after a bound. The stale
/tmp/ray/ray_current_cluster file a stopped head leaves behind is removed when it names
this cluster, so the next plain `ray.init()` does not try to join a dead cluster.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]  # the repository (serve_config.yaml, deployments/)
BIN = Path(sys.executable).parent


def free_port(avoid: range = range(10002, 20000)) -> int:
    """A free TCP port outside Ray's worker port range."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in avoid:
            return port
    raise RuntimeError("no free port")


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


class ServeCluster:
    """A local Ray head plus `serve run CONFIG`; `metrics_url` serves Prometheus text."""

    def __init__(self, config: Path, workdir: Path, *, metrics_report_ms: int = 1000):
        self.config = config
        self.workdir = workdir
        self.gcs_port = free_port()
        self.metrics_port = free_port()
        self.env = {
            **os.environ,
            "RAY_AUTH_MODE": "disabled",
            "RAY_metrics_report_interval_ms": str(metrics_report_ms),
            "PYTHONPATH": str(ROOT),
            "TOKENIZERS_PARALLELISM": "false",
        }
        self.env.pop("RAY_ADDRESS", None)
        self.procs: list[subprocess.Popen] = []
        self.log_path = workdir / "serve.log"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def _spawn(self, args: list[str], log) -> subprocess.Popen:
        proc = subprocess.Popen(
            args,
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def start(self, ready_url: str, ready_body: dict, timeout_s: float = 300.0) -> None:
        # a SIGTERM to the caller must still run its `finally: cluster.stop()`
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _exit_on_sigterm)
        log = open(self.log_path, "w")
        self._spawn(
            [
                str(BIN / "ray"),
                "start",
                "--head",
                "--block",
                f"--port={self.gcs_port}",
                "--num-cpus=2",
                f"--metrics-export-port={self.metrics_port}",
                "--include-dashboard=false",
                "--disable-usage-stats",
            ],
            log,
        )
        time.sleep(4)
        serve = self._spawn(
            [str(BIN / "serve"), "run", f"--address=127.0.0.1:{self.gcs_port}", str(self.config)],
            log,
        )
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if serve.poll() is not None:
                break
            try:
                r = httpx.post(ready_url, json=ready_body, timeout=30)
                if r.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(2)
        tail = self.log_path.read_text()[-5000:]
        self.stop()
        raise RuntimeError(f"the Serve app did not come up within {timeout_s:.0f} s:\n{tail}")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.time() + 30
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=max(1.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        marker = Path("/tmp/ray/ray_current_cluster")
        try:
            if str(self.gcs_port) in marker.read_text():
                marker.unlink()
        except OSError:
            pass
        self.procs.clear()
