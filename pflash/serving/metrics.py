"""Metric names and definitions, in one place.

Base units in the names (`_seconds`, `_tokens`, `_total`). Ray adds the `ray_` prefix on
export and appends `_total` to counters, so a counter is declared without the suffix
(`pflash_requests` is scraped as `ray_pflash_requests_total`). Tag values are strings.
The deployments instantiate these through `ray.serve.metrics`; nothing here imports Ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0)
TOKENS = (64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)
RATIO = (0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class MetricDef:
    """One metric: `name` as declared (Ray prefixes `ray_`; counters gain `_total`)."""

    name: str
    kind: Literal["counter", "histogram", "gauge"]
    description: str
    tag_keys: tuple[str, ...] = ()
    boundaries: tuple[float, ...] = ()

    @property
    def exported_name(self) -> str:
        base = "ray_" + self.name
        return base + "_total" if self.kind == "counter" else base


METRICS: tuple[MetricDef, ...] = (
    MetricDef(
        "pflash_requests",
        "counter",
        "Requests by endpoint and whether the prompt was compressed.",
        ("endpoint", "compressed"),
    ),
    MetricDef(
        "pflash_compression_seconds",
        "histogram",
        "Wall time to compress a prompt (plan, drafter, selection, assembly).",
        (),
        SECONDS,
    ),
    MetricDef(
        "pflash_drafter_forward_seconds",
        "histogram",
        "Drafter forward wall time per scored prompt.",
        (),
        SECONDS,
    ),
    MetricDef(
        "pflash_target_prefill_seconds",
        "histogram",
        "Target prefill wall time.",
        ("compressed",),
        SECONDS,
    ),
    MetricDef(
        "pflash_ttft_seconds",
        "histogram",
        "Time to first token seen by the gateway.",
        ("compressed",),
        SECONDS,
    ),
    MetricDef(
        "pflash_keep_ratio",
        "histogram",
        "Served target tokens / original target tokens (usage.timings.pflash.served_ratio).",
        (),
        RATIO,
    ),
    MetricDef(
        "pflash_input_tokens",
        "histogram",
        "Original prompt tokens (target vocabulary).",
        (),
        TOKENS,
    ),
    MetricDef(
        "pflash_kept_tokens",
        "histogram",
        "Prompt tokens served to the target after compression.",
        (),
        TOKENS,
    ),
    MetricDef("pflash_view_outcomes", "counter", "Multi-turn view decisions by mode.", ("mode",)),
    MetricDef("pflash_recalled_tokens", "counter", "Drafter tokens recalled into a view.", ()),
    MetricDef(
        "pflash_read_aheads",
        "counter",
        "Background drafter passes over a verbatim addition, by outcome (done/failed/skipped).",
        ("outcome",),
    ),
    MetricDef("pflash_rebuilds", "counter", "Views rebuilt from a fresh compression.", ("reason",)),
    MetricDef(
        "pflash_bypasses", "counter", "Requests served uncompressed, by reason.", ("reason",)
    ),
    MetricDef("pflash_errors", "counter", "Failed requests by stage.", ("stage",)),
    MetricDef(
        "pflash_tools_not_offered",
        "counter",
        "Declared tools the model was not offered (hosted tools this server cannot run), by type.",
        ("tool",),
    ),
)

BY_NAME = {m.name: m for m in METRICS}
