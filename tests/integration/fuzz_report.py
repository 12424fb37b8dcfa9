"""Counts of the fuzz suite's answers by family and status, against the shipped app.

    python tests/integration/fuzz_report.py [N]     # N requests (default 1000)

Starts `serve_config.yaml`'s app as shipped (no API keys) on private ports, sends N requests
drawn from `bad_requests.py`, checks `/healthz` after each, and prints one line per
(family, status) and every answer that was a 5xx, not in the OpenAI envelope, or a hang
(60 s). The test (`test_generated_bad_requests_never_get_a_5xx_a_hang_or_a_bare_body`)
asserts the same against the test app; this prints the table docs/BENCHMARK_NOTEBOOK.md quotes.
"""

from __future__ import annotations

import collections
import sys
import tempfile
from pathlib import Path

import httpx
import yaml
from hypothesis import HealthCheck, given, settings

sys.path.insert(0, str(Path(__file__).parent))
from bad_requests import BAD_REQUESTS  # noqa: E402

from pflash_lab.bench.launch import ROOT, ServeCluster, free_port  # noqa: E402


def main(n: int) -> int:
    work = Path(tempfile.mkdtemp(prefix="pflash-fuzz-"))
    cfg = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    port = free_port()
    cfg["http_options"]["port"] = port
    for dep in cfg["applications"][0]["deployments"]:
        dep["ray_actor_options"]["num_cpus"] = 0.1
    (work / "serve_config.yaml").write_text(yaml.safe_dump(cfg))
    cluster = ServeCluster(work / "serve_config.yaml", work)
    url = f"http://127.0.0.1:{port}"
    cluster.start(f"{url}/v1/completions", {"prompt": "Hi", "max_tokens": 1})
    counts: collections.Counter = collections.Counter()
    bad: list = []
    http = httpx.Client(timeout=60)

    @settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(BAD_REQUESTS)
    def send(req):
        try:
            r = http.request(req.method, url + req.path, content=req.body, headers=req.headers)
            status = r.status_code
            try:
                body = r.json()
            except ValueError:
                body = None
            error = body.get("error") if isinstance(body, dict) else None
            enveloped = status == 200 or (isinstance(error, dict) and "message" in error)
        except httpx.TimeoutException:
            status, enveloped, body = "timeout", False, None
        counts[(req.family, status)] += 1
        if status == "timeout" or status >= 500 or not enveloped:
            bad.append((req.family, status, req.method, req.path, req.body[:200], str(body)[:200]))
        assert http.get(f"{url}/healthz").status_code == 200

    try:
        send()
    finally:
        cluster.stop()
    by_status = collections.Counter()
    for (family, status), k in sorted(counts.items(), key=str):
        print(f"{family:22} {status!s:8} {k}")
        by_status[status] += k
    print("by status:", dict(sorted(by_status.items(), key=str)))
    print(f"5xx, bare bodies or hangs: {len(bad)}")
    for row in bad[:50]:
        print(row)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000))
