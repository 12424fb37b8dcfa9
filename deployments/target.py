"""TargetModel deployment: one target backend per replica (transformers, an upstream by URL,
or Ray Serve LLM's LLMServer in the same cluster through `HandleTransport`).

`generate` streams `GenerationEvent`s (a handle call with `stream=True`); the ingress turns
them into SSE or one response. Conversations prefer the replica holding their KV prefix
snapshot through the consistent-hash router on `session_id`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from ray import serve

from deployments.resources import apply_thread_limits, freeze_startup_heap
from pflash.config import TargetModelPart, build_part
from pflash.models.loading import use_device
from pflash.models.target.protocol import GenerationEvent, SamplingParams, UpstreamError

log = logging.getLogger("ray.serve")


class HandleTransport:
    """`ChunkTransport` to `TokenIdCompletions` of the `ray_llm_app` application
    (deployments/ray_llm.py, in vLLM's environment): the same `/v1/completions` body the
    openai backend POSTs, plain dicts back. The handle is looked up at the first call, so
    the two applications of one Serve config may come up in either order: while the other
    does not exist a call is a 502 upstream_unavailable; while its replicas start, a call
    waits (Serve queues it) up to upstream_timeout_s, then is a 504."""

    def __init__(self, app: str):
        self.app = app
        self._handle: Any = None

    def handle(self) -> Any:
        if self._handle is None:
            from deployments.ray_llm import ADAPTER_NAME

            try:
                handle = serve.get_deployment_handle(ADAPTER_NAME, app_name=self.app)
            except Exception as exc:  # Serve raises a bare exception when the app is missing
                raise UpstreamError(
                    f"upstream unavailable: Serve application {self.app!r} has no "
                    f"{ADAPTER_NAME} deployment (ray_llm_app): {exc}",
                    code="upstream_unavailable",
                ) from exc
            self._handle = handle
        return self._handle.options(stream=True)

    async def ready(self) -> None:
        """The engine behind the adapter passes its health check (see TokenIdCompletions)."""
        self.handle()
        await self._handle.ready.remote()

    async def __call__(
        self, path: str, body: dict[str, Any], headers: dict[str, str]
    ) -> AsyncIterator[dict[str, Any]]:
        if path != "/completions":
            raise UpstreamError(f"ray_llm serves /completions only, not {path}")
        chunks = self.handle().completions.remote(body)
        finished = False
        try:
            async for chunk in chunks:
                yield chunk
            finished = True
        finally:
            if not finished:  # the client left or a deadline passed: stop vLLM's decode too
                chunks.cancel()


@serve.deployment(name="TargetModel", ray_actor_options={"num_cpus": 1}, max_ongoing_requests=4)
class TargetModelDeployment:
    def __init__(self, config: dict[str, Any]):
        """`config`: the keys of this deployment's `TargetModelPart` (build_app)."""
        self.config = build_part(TargetModelPart, config)
        self.transport: HandleTransport | None = None
        threads = apply_thread_limits()
        use_device(self.config.device)  # tensors the model code creates land beside it
        if self.config.target_backend in ("openai", "ray_llm"):
            from pflash.models.source import load_tokenizer
            from pflash.models.target.upstream import OpenAITarget

            tokenizer = load_tokenizer(self.config.target_tokenizer or self.config.target)
            max_ctx = self.config.max_context or int(getattr(tokenizer, "model_max_length", 8192))
            if self.config.target_backend == "ray_llm":
                self.transport = HandleTransport(self.config.ray_llm_app)
            self.backend = OpenAITarget.from_config(self.config, tokenizer, max_ctx, self.transport)
        else:
            from pflash.models.target.hf import TransformersTarget

            self.backend = TransformersTarget.from_config(self.config, num_threads=threads)
        freeze_startup_heap()
        log.info(
            "TargetModel ready: %s backend, context %d",
            self.config.target_backend,
            self.backend.max_context,
        )

    def info(self) -> dict[str, Any]:
        return {"max_context": self.backend.max_context, "backend": self.config.target_backend}

    async def ready(self) -> dict[str, Any]:
        """`info`, once the target can answer: for ray_llm, once Ray Serve LLM's engine is up
        (it starts minutes after this replica); the other backends are ready when loaded."""
        if self.transport is not None:
            await self.transport.ready()
        return self.info()

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
