"""What a failing integration test reports from Ray's logs (`ServeCluster.incidents`), and
which processes a test's cluster owns (`ServeCluster.own_processes`)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from pflash_lab.bench.launch import ServeCluster, descendants, group_members


def _cluster(tmp_path, files: dict[str, str]) -> ServeCluster:
    cluster = ServeCluster(tmp_path / "serve_config.yaml", tmp_path)
    cluster.ray_temp = tmp_path / "ray"
    for name, text in files.items():
        path = cluster.ray_temp / "session_latest" / "logs" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return cluster


def test_incidents_are_warnings_errors_worker_deaths_and_failed_requests_in_time_order(tmp_path):
    cluster = _cluster(
        tmp_path,
        {
            "serve/replica_pflash_Ingress_a.log": (
                "INFO 2026-12-05 03:04:23,100 pflash_Ingress a -- POST /v1/chat 200 3ms\n"
                "ERROR 2026-12-05 03:04:25,000 pflash_Ingress a -- request failed (503)\n"
                "INFO 2026-12-05 03:04:26,000 pflash_Ingress a r-2 -- GET /v1/models CANCELLED 4.7ms\n"
            ),
            "serve/proxy_1.log": (
                "WARNING 2026-12-05 03:04:24,000 proxy -- Request failed\n"
                "INFO 2026-12-05 03:04:26,100 proxy 1 r-2 -- GET /v1/models 499 13.6ms\n"
                "INFO 2026-12-05 03:04:26,200 proxy 1 r-3 -- POST /v1/messages 500 3.1ms\n"
            ),
            "raylet.out": (
                "[2026-12-05 03:04:23,500 I 1 1] (raylet) node_manager.cc: lease granted\n"
                "[2026-12-05 03:04:23,900 E 1 1] (raylet) Killing worker 7: memory used 0.96\n"
            ),
        },
    )
    lines = cluster.incidents().splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "raylet.out",
        "proxy_1.log",
        "replica_pflash_Ingress_a.log",
        "replica_pflash_Ingress_a.log",  # the cancelled request, then the proxy's view of it
        "proxy_1.log",
        "proxy_1.log",
    ]
    assert "Killing worker 7" in lines[0]
    assert lines[-1].endswith("POST /v1/messages 500 3.1ms")
    assert "200 3ms" not in "\n".join(lines)  # an ordinary access line is not an incident


def test_incidents_keep_the_last_lines_and_read_a_missing_log_dir_as_none(tmp_path):
    lines = "".join(f"ERROR 2026-12-05 03:04:{i:02d},000 x -- failure {i}\n" for i in range(30))
    cluster = _cluster(tmp_path, {"serve/controller_1.log": lines})
    kept = cluster.incidents(limit=5).splitlines()
    assert [line.rsplit(" ", 1)[-1] for line in kept] == ["25", "26", "27", "28", "29"]
    assert ServeCluster(tmp_path / "c.yaml", tmp_path / "none").incidents() == ""


def test_a_cluster_owns_its_daemons_and_their_workers_and_no_other_process(tmp_path):
    """What a fault test may kill: a machine-wide search by title also killed the replicas of
    a benchmark app running beside the suite."""
    # a daemon (its own session, as `ray start` is) with a worker child, and a stranger
    daemon = subprocess.Popen(["bash", "-c", "sleep 60 & wait"], start_new_session=True)
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        cluster = ServeCluster(tmp_path / "serve_config.yaml", tmp_path)
        deadline = time.monotonic() + 10
        while not (workers := descendants({daemon.pid})) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert workers, "the daemon's child never started"
        cluster.ray_roots = group_members(daemon.pid)
        owned = cluster.own_processes()
        assert {daemon.pid, *workers} <= owned
        assert stranger.pid not in owned and os.getpid() not in owned
    finally:
        os.killpg(daemon.pid, signal.SIGKILL)
        stranger.kill()
        daemon.wait()
        stranger.wait()
