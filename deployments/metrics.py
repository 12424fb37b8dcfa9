"""Ray Serve metric objects for the definitions in pflash/serving/metrics.py (one per process)."""

from __future__ import annotations

from typing import Any

from pflash.serving.metrics import METRICS


class ServeMetrics:
    """`record(name, value, **tags)` for every metric of pflash.serving.metrics.METRICS.

    Counters `inc`, histograms `observe`, gauges `set`. A metric failure is never allowed
    to fail a request (Ray's metrics API raises on a missing tag): it is swallowed.
    """

    def __init__(self) -> None:
        from ray.serve import metrics

        self._m: dict[str, tuple[str, Any]] = {}
        for d in METRICS:
            tags = tuple(d.tag_keys) or None
            if d.kind == "counter":
                obj = metrics.Counter(d.name, description=d.description, tag_keys=tags)
            elif d.kind == "histogram":
                obj = metrics.Histogram(
                    d.name, description=d.description, boundaries=list(d.boundaries), tag_keys=tags
                )
            else:
                obj = metrics.Gauge(d.name, description=d.description, tag_keys=tags)
            self._m[d.name] = (d.kind, obj)

    def record(self, name: str, value: float = 1.0, **tags: str) -> None:
        kind, obj = self._m[name]
        tags = {k: str(v) for k, v in tags.items()} or None
        try:
            if kind == "counter":
                obj.inc(value, tags=tags)
            elif kind == "histogram":
                obj.observe(value, tags=tags)
            else:
                obj.set(value, tags=tags)
        except Exception:  # metrics must never break serving
            pass
