"""On a failed integration test, the report carries what Ray logged about the failure.

A replica that dies mid-request reaches the client as a bare 500 from Serve's proxy; the
cluster's logs, which say why (a worker killed for memory, a crash, a failed health check),
are gone once the module's cluster stops. This hook copies their warnings and errors into
the failing test's report while the cluster still runs.
"""

from __future__ import annotations

import pytest

from pflash_lab.bench.launch import LIVE


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        for cluster in list(LIVE):
            warmup = getattr(cluster, "warmup_failures", [])  # test_serve_app's fixture
            text = "\n".join([*(f"warm-up: {line}" for line in warmup), cluster.incidents()])
            report.sections.append(("ray incidents", text))
