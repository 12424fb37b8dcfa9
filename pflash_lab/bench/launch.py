"""Start the real application the way an operator does (used by the integration tests and
the HTTP benchmarks): a local Ray head with pinned ports (`ray start --head`), then
`serve run --address ... CONFIG`.

Cleanup must leave nothing behind, or a later test or benchmark shares the 2 CPUs with a
dead run's replicas: the head's daemons stay in `ray start`'s process group, Ray workers
run in their own groups under the raylet, and a backgrounded `serve run` ignores SIGINT.
So every process is started in its own session, worker ids are collected before the raylet
goes, groups get SIGTERM then SIGKILL after a grace period, and surviving workers are
killed. Ray's files go to a private `--temp-dir`, so no `/tmp/ray/ray_current_cluster` from
this run can mislead a later plain `ray.init()`.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]  # the repository (serve_config.yaml, deployments/)
BIN = Path(sys.executable).parent


RAY_WORKER_PORTS = range(10002, 20000)  # Ray's default --min/--max-worker-port


def ephemeral_ports(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> range:
    """The kernel's range for ports bound to 0 and for the local end of outgoing connections
    (Linux's default where the file cannot be read)."""
    try:
        low, high = (int(x) for x in Path(path).read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def pinned_candidates(avoid: range = RAY_WORKER_PORTS) -> list[int]:
    """Ports a cluster may pin: above Ray's worker range and outside the ephemeral range.
    A pinned port inside the ephemeral range can be taken between its choice and its bind by
    any process binding port 0 or opening a connection: `ray start`'s agents did, and Serve's
    proxy then failed to bind its HTTP port and a whole test module errored."""
    ephemeral = ephemeral_ports()
    return [p for p in range(max(avoid.stop, 1024), 65536) if p not in ephemeral]


def free_ports(n: int, avoid: range = RAY_WORKER_PORTS) -> list[int]:
    """`n` distinct free TCP ports from `pinned_candidates`, drawn at random (two clusters
    started one after the other rarely draw the same). Every socket stays bound until all
    are chosen: ports picked one at a time could repeat (`ray start` then refused a dashboard
    port equal to the GCS port, and a whole test module errored)."""
    candidates = pinned_candidates(avoid)
    draw = random.SystemRandom()
    held: list[socket.socket] = []
    try:
        for _ in range(100 * n):
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", draw.choice(candidates)))
            except OSError:  # taken, or already held by this choice
                s.close()
                continue
            held.append(s)
            if len(held) == n:
                return [h.getsockname()[1] for h in held]
        raise RuntimeError(f"no {n} free ports outside the ephemeral and Ray worker ranges")
    finally:
        for s in held:
            s.close()


def free_port(avoid: range = RAY_WORKER_PORTS) -> int:
    """A free TCP port a cluster may pin (`free_ports`)."""
    return free_ports(1, avoid)[0]


# ------------------------------------------------------------------ process bookkeeping


def _parents() -> dict[int, int]:
    out: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            out[int(stat.parent.name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    return out


def descendants(roots: set[int]) -> set[int]:
    """Live processes whose parent chain reaches `roots` (Ray workers are raylet children)."""
    parent = _parents()
    found, frontier = set(), set(roots)
    while frontier:
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier} - found
        found |= frontier
    return found


def group_members(pgid: int) -> set[int]:
    """Live (non-zombie) processes in process group `pgid`."""
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[2]) == pgid:
                out.add(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def stop_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM the process group `proc` leads, SIGKILL whatever is left after `grace_s`."""
    pgid = proc.pid
    proc.poll()  # reap the leader if it is done: a zombie would still count as a member
    if group_members(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            proc.poll()
            if not group_members(pgid):
                break
            time.sleep(0.2)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def scratch_dir(prefix: str) -> Path:
    """A work folder for one bench run, removed when the process exits.

    It holds the run's serve config, Ray's logs and often a random-weight target of 3 GB;
    runs that left theirs behind once filled a disk. `PFLASH_KEEP_WORK=1` keeps it, to read
    the logs after a run."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    if os.environ.get("PFLASH_KEEP_WORK") == "1":
        print(f"work folder kept: {work}", file=sys.stderr)
    else:
        atexit.register(shutil.rmtree, work, ignore_errors=True)
    return work


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


# ------------------------------------------------------------------ the cluster

LIVE: set[ServeCluster] = set()  # started and not yet stopped: what a failing test reports
# a Serve line at WARNING or ERROR, a raylet line at W, E or F, a worker killed or crashed
# warnings and errors; the raylet's worker deaths; and access lines of requests that ended
# in a 5xx or were cancelled (Serve logs both at INFO: a client's bare 500 came from a
# request the replica logged as CANCELLED and the proxy as 499, "client disconnected")
INCIDENT = re.compile(
    r"^(WARNING|ERROR)\b|^\[[^\]]* [WEF] \d|Killing worker|SIGSEGV|core dumped"
    r"| -- [A-Z]+ \S+ (499|5\d\d|CANCELLED) [\d.]+ms$"
)
STAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}")


class ServeCluster:
    """A local Ray head plus `serve run CONFIG`; `metrics_url` serves Prometheus text."""

    def __init__(
        self,
        config: Path,
        workdir: Path,
        *,
        metrics_report_ms: int = 1000,
        head_cpus: int = 2,
        head_resources: dict[str, float] | None = None,
    ):
        self.config = config
        self.head_cpus = head_cpus
        self.head_resources = head_resources or {}
        self.nodes: dict[str, tuple[subprocess.Popen, set[int]]] = {}
        self.workdir = Path(workdir)
        names = ("gcs", "metrics", "agent", "grpc", "env", "dash")
        self.ports = dict(zip(names, free_ports(len(names)), strict=True))
        self.metrics_port = self.ports["metrics"]
        self.env = {
            **os.environ,
            "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_metrics_report_interval_ms": str(metrics_report_ms),
            # the raylet's registration wait (30 s by default) ran out on a loaded 2-core
            # machine: `ray start` failed and a whole test module errored
            "RAY_raylet_start_wait_time_s": os.environ.get("RAY_raylet_start_wait_time_s", "120"),
            "PYTHONPATH": str(ROOT),
            "TOKENIZERS_PARALLELISM": "false",
        }
        self.env.pop("RAY_ADDRESS", None)
        self.procs: list[tuple[subprocess.Popen, float]] = []
        self.ray_roots: set[int] = set()
        self.log_path = self.workdir / "serve.log"
        self.ray_temp = self.workdir  # Ray's --temp-dir, set when the head starts
        self._logs: list = []

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def _spawn(self, args: list[str], log_name: str, grace_s: float) -> subprocess.Popen:
        log = open(self.workdir / log_name, "w")
        self._logs.append(log)
        proc = subprocess.Popen(
            args,
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append((proc, grace_s))
        return proc

    def _tails(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-3000:]}"
            for p in sorted(self.workdir.glob("*.log"))
            if p.is_file()
        )

    def start(
        self,
        ready_url: str,
        ready_body: dict,
        timeout_s: float = 300.0,
        headers: dict[str, str] | None = None,
    ) -> None:
        """The head, then the app; returns once `ready_url` answers `ready_body` (sent with
        `headers`, e.g. an API key) with 200."""
        started = time.monotonic()
        self.start_head(timeout_s)
        self.serve(ready_url, ready_body, timeout_s - (time.monotonic() - started), headers)

    def incidents(self, limit: int = 60) -> str:
        """The last `limit` lines of Ray's logs that tell why a request failed: warnings and
        errors of the Serve controller, proxy and replicas, and the raylet's worker deaths
        (memory kills included). A test that fails on a bare 500 from Serve (a replica that
        died) has nothing else to go on once the cluster is gone."""
        logs = self.ray_temp / "session_latest" / "logs"
        found: list[tuple[str, str]] = []
        for path in sorted([*logs.glob("serve/*.log"), *logs.glob("raylet.out")]):
            with contextlib.suppress(OSError):
                for line in path.read_text(errors="replace").splitlines():
                    if INCIDENT.search(line):
                        stamp = STAMP.search(line)
                        found.append((stamp[0] if stamp else "", f"{path.name}: {line[:400]}"))
        found.sort(key=lambda pair: pair[0])  # in time order across the files
        return "\n".join(text for _, text in found[-limit:])

    def start_head(self, timeout_s: float = 300.0) -> None:
        # a SIGTERM to the caller must still run its `finally: cluster.stop()`
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _exit_on_sigterm)
        deadline = time.monotonic() + timeout_s
        temp = Path(f"/tmp/pfl{os.getpid()}-{self.ports['gcs']}")  # short: Ray socket paths
        self.ray_temp = temp
        LIVE.add(self)
        p = self.ports
        ray_start = self._spawn(
            [
                str(BIN / "ray"),
                "start",
                "--head",
                f"--num-cpus={self.head_cpus}",
                f"--resources={json.dumps(self.head_resources)}",
                f"--port={p['gcs']}",
                f"--metrics-export-port={p['metrics']}",
                f"--dashboard-agent-listen-port={p['agent']}",
                f"--dashboard-agent-grpc-port={p['grpc']}",
                f"--runtime-env-agent-port={p['env']}",
                f"--dashboard-port={p['dash']}",
                "--include-dashboard=false",
                "--disable-usage-stats",
                f"--temp-dir={temp}",
            ],
            "ray_start.log",
            5.0,
        )
        while ray_start.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)  # `ray start` returns once the head is up
        if ray_start.returncode != 0:
            tails = self._tails()
            self.stop()
            raise RuntimeError(f"ray start failed:\n{tails}")
        self.ray_roots = group_members(ray_start.pid)  # its daemons stay in its group

    def serve(
        self,
        ready_url: str,
        ready_body: dict,
        timeout_s: float = 300.0,
        headers: dict[str, str] | None = None,
    ) -> None:
        """`serve run CONFIG` on the cluster, until `ready_url` answers `ready_body` (sent with
        `headers`) with 200."""
        deadline = time.monotonic() + timeout_s
        p = self.ports
        serve = self._spawn(
            [str(BIN / "serve"), "run", f"--address=127.0.0.1:{p['gcs']}", str(self.config)],
            "serve.log",
            10.0,
        )
        while time.monotonic() < deadline and serve.poll() is None:
            try:
                reply = httpx.post(ready_url, json=ready_body, headers=headers, timeout=30)
                if reply.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(2)
        tails = self._tails()
        self.stop()
        raise RuntimeError(f"the Serve app did not come up within {timeout_s:.0f} s:\n{tails}")

    def start_node(self, name: str, num_cpus: int, resources: dict[str, float]) -> None:
        """Join a second Ray node on this machine (its own raylet, ports and resources), as
        a worker machine would join the head; a deployment that asks for one of
        `resources` is placed on it."""
        kinds = ("nm", "om", "metrics", "agent", "grpc", "env")
        ports = dict(zip(kinds, free_ports(len(kinds)), strict=True))
        proc = self._spawn(
            [
                str(BIN / "ray"),
                "start",
                f"--address=127.0.0.1:{self.ports['gcs']}",
                f"--num-cpus={num_cpus}",
                f"--resources={json.dumps(resources)}",
                f"--node-manager-port={ports['nm']}",
                f"--object-manager-port={ports['om']}",
                f"--metrics-export-port={ports['metrics']}",
                f"--dashboard-agent-listen-port={ports['agent']}",
                f"--dashboard-agent-grpc-port={ports['grpc']}",
                f"--runtime-env-agent-port={ports['env']}",
                "--disable-usage-stats",
            ],
            f"node_{name}.log",
            5.0,
        )
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        if proc.returncode != 0:
            raise RuntimeError(f"ray start (node {name}) failed:\n{self._tails()}")
        self.nodes[name] = (proc, group_members(proc.pid))

    def kill_node(self, name: str) -> None:
        """SIGKILL a node's raylet and everything it runs: a machine that is lost."""
        proc, roots = self.nodes.pop(name)
        victims = roots | descendants(roots)
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.poll()

    def own_processes(self) -> set[int]:
        """Every live process of this cluster (its daemons, their workers, its added nodes'):
        what a fault test may kill, and nothing of another app on the same machine."""
        roots = set(self.ray_roots).union(*(pids for _, pids in self.nodes.values()))
        return roots | descendants(roots)

    def stop(self) -> None:
        LIVE.discard(self)
        for name in list(self.nodes):
            self.kill_node(name)
        workers = descendants(self.ray_roots)
        for proc, grace_s in reversed(self.procs):
            stop_group(proc, grace_s)
        for pid in workers:
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for log in self._logs:
            log.close()
        self.procs.clear()
        self._logs.clear()
        # Ray's session files (logs, sockets; a few MB a cluster) go with the cluster, as
        # the work folder does (`scratch_dir`); PFLASH_KEEP_WORK=1 keeps both
        if self.ray_temp != self.workdir and os.environ.get("PFLASH_KEEP_WORK") != "1":
            shutil.rmtree(self.ray_temp, ignore_errors=True)
