"""build_app(args) -> the bound Serve graph. `serve_config.yaml` points its import_path here.

`args` are PFlash config keys (pflash/config/), e.g. `drafter`, `target`,
`target_backend`, `keep_ratio`; `user_config` on a deployment changes the live knobs.
The config is validated here, once, so a bad value fails the deploy with a message naming
the key, the value and what is allowed, before any model loads.

The Ingress runs the whole request flow and gets the whole config. Every other deployment
gets only its part, the components it reads (`DrafterScorerPart`, `ScoringConfig`,
`TargetModelPart`, `ViewsConfig`), as the flat keys that differ from the defaults.
"""

from __future__ import annotations

from typing import Any

from ray.serve import Application
from ray.serve.config import DeploymentActorConfig

from deployments.drafter import DrafterScorerDeployment
from deployments.ingress import Ingress
from deployments.probe import SegmentProbeDeployment
from deployments.session_store import STORE_NAME, SessionStoreActor, views_part
from deployments.target import TargetModelDeployment
from pflash.config import (
    DrafterScorerPart,
    PFlashConfig,
    ScoringConfig,
    TargetModelPart,
    build_config,
)
from pflash.config.artefacts import resolve_artefact
from pflash.models.source import resolve_source


def part_args(config: PFlashConfig, part: type) -> dict[str, Any]:
    """The init argument of a deployment given `part` of `config`: its non-default keys."""
    return config.part(part).model_dump(mode="json", exclude_defaults=True)


def build_app(args: dict[str, Any] | None = None) -> Application:
    config = build_config(dict(args or {}))
    resolve_source(config.drafter)  # a missing model fails now, saying how to provide it
    if config.target_backend == "transformers":
        resolve_source(config.target)
    drafter = DrafterScorerDeployment.bind(part_args(config, DrafterScorerPart))
    probe = None
    if config.segment_probe_gguf and config.select_segments != "fixed":
        resolve_artefact("probe", config.segment_probe_gguf, config.drafter)  # fails if absent
        probe = SegmentProbeDeployment.bind(part_args(config, ScoringConfig))
    target = TargetModelDeployment.bind(part_args(config, TargetModelPart))
    store = DeploymentActorConfig(
        name=STORE_NAME,
        actor_class=SessionStoreActor,
        init_kwargs={"config": views_part(config)},
        actor_options={"num_cpus": 0},
    )
    data = config.model_dump(mode="json", exclude_defaults=True)
    return Ingress.options(deployment_actors=[store]).bind(data, drafter, target, probe)
