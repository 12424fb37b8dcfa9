"""SegmentProbe deployment: unit boundaries from the drafter's tap (§4.7).

Its own deployment so the probe can be swapped, scaled or turned off without touching the
drafter. It never holds the drafter: the probe is bound to the drafter *file* (sha256,
tap, family), which is checked at startup from the file alone. The ingress passes the
drafter's response straight in as a top-level argument, so the tap [S, hidden] travels
as an object ref and never through the ingress.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from ray import serve

from deployments.resources import apply_thread_limits, freeze_startup_heap
from pflash.compress.plan.segments import ProbeParams
from pflash.compress.scoring import ScoreResult
from pflash.config import ScoringConfig, build_part

log = logging.getLogger("ray.serve")


@serve.deployment(name="SegmentProbe", ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=4)
class SegmentProbeDeployment:
    def __init__(self, config: dict[str, Any]):
        """`config`: the keys of the drafter's `ScoringConfig` (build_app)."""
        from pflash.config.artefacts import resolve_artefact
        from pflash.models.probe import drafter_probe_identity, load_segment_probe

        apply_thread_limits()
        cfg = build_part(ScoringConfig, config)
        identity = drafter_probe_identity(cfg)
        path = resolve_artefact("probe", cfg.segment_probe_gguf, cfg.drafter, identity.feature_tap)
        self.probe = load_segment_probe(path, identity, memo=cfg.drafter_sessions)
        freeze_startup_heap()
        log.info(
            "SegmentProbe ready: %s (threshold %.3f, min %d, max %d)",
            path,
            self.probe.params.threshold,
            self.probe.params.min_segment,
            self.probe.params.max_segment,
        )

    def segment(self, scores: ScoreResult) -> tuple[np.ndarray, np.ndarray | None]:
        """(unit boundary probabilities float32 [S], sub-unit probabilities or None)."""
        return self.probe(scores)

    def params(self) -> ProbeParams:
        """The cut parameters the file carries (threshold, min/max segment)."""
        return self.probe.params
