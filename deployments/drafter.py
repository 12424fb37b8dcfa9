"""DrafterScorer deployment: loads the drafter once per replica and scores prompts.

Requests of one conversation carry `session_id` (the ingress forwards its conversation key)
so the consistent-hash router sends them to the replica holding the scoring session;
landing elsewhere is correct, only slower.

Serve runs sync methods on a thread pool; the scorer runs one pass at a time (its own lock),
so a second request waits rather than sharing the model's layer hooks.
"""

from __future__ import annotations

import logging
from typing import Any

from ray import serve

from deployments.resources import apply_thread_limits, freeze_startup_heap
from pflash.compress.scoring import ScoreRequest, ScoreResult
from pflash.config import DrafterScorerPart, build_part
from pflash.models.loading import use_device

log = logging.getLogger("ray.serve")


@serve.deployment(name="DrafterScorer", ray_actor_options={"num_cpus": 0.5}, max_ongoing_requests=2)
class DrafterScorerDeployment:
    def __init__(self, config: dict[str, Any]):
        """`config`: the keys of this deployment's `DrafterScorerPart` (build_app)."""
        from pflash.models.drafter.scorer import DrafterScorer

        self._base = dict(config)
        threads = apply_thread_limits()
        self.config = build_part(DrafterScorerPart, self._base)
        use_device(self.config.device)  # tensors the model code creates land beside it
        self.scorer = DrafterScorer(self.config)
        freeze_startup_heap()
        log.info("DrafterScorer ready (%d torch threads)", threads)

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Live knobs (selection/query settings) need no reload; the model stays loaded."""
        self.config = build_part(DrafterScorerPart, {**self._base, **(user_config or {})})
        self.scorer.config = self.config

    def score(self, request: ScoreRequest) -> ScoreResult:
        return self.scorer(request)

    def ready(self) -> bool:
        """For the ingress's /readyz: the model is loaded and the replica answers."""
        self.check_health()
        return True

    def check_health(self) -> None:
        if self.scorer is None:
            raise RuntimeError("drafter not loaded")
