"""TargetModel deployment: one target backend per replica (transformers or an upstream).

`generate` streams `GenerationEvent`s (a handle call with `stream=True`); the ingress turns
them into SSE or one response. Conversations prefer the replica holding their KV prefix
snapshot through the consistent-hash router on `session_id`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from ray import serve

from deployments.resources import apply_thread_limits
from pflash.config import TargetModelPart, build_part
from pflash.models.loading import use_device
from pflash.models.target.protocol import GenerationEvent, SamplingParams

log = logging.getLogger("ray.serve")


@serve.deployment(name="TargetModel", ray_actor_options={"num_cpus": 1}, max_ongoing_requests=4)
class TargetModelDeployment:
    def __init__(self, config: dict[str, Any]):
        """`config`: the keys of this deployment's `TargetModelPart` (build_app)."""
        self.config = build_part(TargetModelPart, config)
        threads = apply_thread_limits()
        use_device(self.config.device)  # tensors the model code creates land beside it
        if self.config.target_backend == "openai":
            from pflash.models.source import load_tokenizer
            from pflash.models.target.upstream import OpenAITarget

            tokenizer = load_tokenizer(self.config.target_tokenizer or self.config.target)
            max_ctx = self.config.max_context or int(getattr(tokenizer, "model_max_length", 8192))
            self.backend = OpenAITarget.from_config(self.config, tokenizer, max_ctx)
        else:
            from pflash.models.target.hf import TransformersTarget

            self.backend = TransformersTarget.from_config(self.config, num_threads=threads)
        log.info(
            "TargetModel ready: %s backend, context %d",
            self.config.target_backend,
            self.backend.max_context,
        )

    def info(self) -> dict[str, Any]:
        return {"max_context": self.backend.max_context, "backend": self.config.target_backend}

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        snapshot_cut: int | None = None,
        session_id: str | None = None,
        tenant: str | None = None,
    ) -> AsyncIterator[GenerationEvent]:
        async for event in self.backend.generate(
            prompt_ids, params, snapshot_cut=snapshot_cut, session_id=session_id, tenant=tenant
        ):
            yield event
