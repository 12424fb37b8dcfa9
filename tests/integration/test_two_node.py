"""The app on a two-node Ray cluster, and the loss of the node that runs the target.

Both nodes run on this machine, as a head and a worker machine would: `ray start --head`
with a `head_node` resource, then a second `ray start --address` with its own raylet, ports
and a `target_node` resource. The drafter (and every other deployment) is pinned to the
head, the target to the worker, by those custom resources. With requests in flight the
worker node is SIGKILLed (its raylet and every process it runs, as when a machine is lost):
those requests end with an envelope error, requests sent while the node is gone end with one
too (no target replica can be placed: none hangs past `remote_call_timeout_s`, none is
served uncompressed), and once a node with `target_node` joins again, Serve places the
target there and requests succeed. The printed times are measurements, not assertions.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from pflash_lab.bench.launch import ServeCluster, free_port

sys.path.insert(0, str(Path(__file__).parent))  # faults.py, shared with the other fault tests
import faults  # noqa: E402

pytestmark = pytest.mark.integration

CALL_DEADLINE_S = 30.0


def _config(tmp: Path, port: int) -> Path:
    def edit(dep: dict) -> None:
        node = "target_node" if dep["name"] == "TargetModel" else "head_node"
        dep["ray_actor_options"]["resources"] = {node: 0.01}
        if dep["name"] == "TargetModel":
            dep["ray_actor_options"]["num_cpus"] = 0.85
        if dep["name"] == "DrafterScorer":
            dep["ray_actor_options"]["num_cpus"] = 0.7

    return faults.write_config(tmp, port, CALL_DEADLINE_S, edit)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("two_node")
    port = free_port()
    cluster = ServeCluster(_config(tmp, port), tmp, head_cpus=1, head_resources={"head_node": 1})
    cluster.url = f"http://127.0.0.1:{port}"
    try:
        cluster.start_head()
        cluster.start_node("worker", num_cpus=1, resources={"target_node": 1})
        cluster.serve(f"{cluster.url}/v1/completions", {"prompt": "Hi", "max_tokens": 1})
        yield cluster
    finally:
        cluster.stop()


def test_losing_the_target_node_fails_requests_cleanly_until_a_node_rejoins(cluster):
    url = cluster.url
    r, _ = faults.burst(url, [faults.body(400)])[0]
    assert (
        faults.answer_or_envelope(r) == "200"
    )  # both nodes serve: drafter on one, target on the other

    killed_at = 0.0

    def lose_the_node():
        nonlocal killed_at
        time.sleep(2.0)
        cluster.kill_node("worker")
        killed_at = time.monotonic()

    in_flight = faults.burst(url, [faults.body(410 + i) for i in range(3)], during=lose_the_node)
    outcomes = sorted(faults.answer_or_envelope(r) for r, _ in in_flight)

    gone = faults.burst(url, [faults.body(420)])[0]
    gone_outcome = faults.answer_or_envelope(gone[0])
    assert gone_outcome != "200", "a target replica was served with its node gone"
    assert gone[1] < CALL_DEADLINE_S + 30, f"a request waited {gone[1]:.0f} s with the node gone"

    rejoined_at = time.monotonic()
    cluster.start_node("worker2", num_cpus=1, resources={"target_node": 1})
    since_kill, took, refused = faults.recovery(url, rejoined_at, faults.body(430))
    print(
        f"\nworker node lost {time.monotonic() - killed_at:.0f} s ago: in-flight {outcomes};"
        f" while gone {gone_outcome} after {gone[1]:.1f} s; a node rejoined and a request"
        f" succeeded {since_kill:.1f} s later (node start included; its own latency {took:.1f} s,"
        f" {refused} refused before it)"
    )
