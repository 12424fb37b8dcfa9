"""Ingress deployment: the HTTP edge of the graph (FastAPI), stateless. It binds and routes;
`pflash.serving` does the work.

Binding: the DrafterScorer, SegmentProbe and SessionStore reach the `Compressor` through the
small adapters below (Ray handles as async callables), the TargetModel reaches the answer
path as `generate`, and both tokenizers load here. Routing: each route hands its request to
`pflash.serving.gateway.Gateway` with its API (the answer strategy of chat completions or
completions; the translation of Anthropic Messages or OpenAI Responses). Request ids and
error envelopes are the middleware's (`pflash.serving.middleware`).
"""

import asyncio
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.metrics import ServeMetrics
from deployments.resources import freeze_startup_heap
from deployments.session_store import SessionStoreClient, views_part
from pflash.compress.scoring import ScoreRequest
from pflash.config import PFlashConfig, build_config
from pflash.flow.compressor import Compressor
from pflash.flow.request import tenant_of
from pflash.models.source import load_tokenizer
from pflash.models.target.protocol import SamplingParams
from pflash.serving.chat_completion.serving import ChatAnswer
from pflash.serving.completion.serving import CompletionAnswer
from pflash.serving.gateway import Gateway
from pflash.serving.messages.translate import COUNT as MESSAGES_COUNT
from pflash.serving.messages.translate import EDGE as MESSAGES
from pflash.serving.middleware import install
from pflash.serving.readiness import RETRY_AFTER_S, ReadinessCache
from pflash.serving.responses.translate import COUNT as RESPONSES_COUNT
from pflash.serving.responses.translate import EDGE as RESPONSES
from pflash.serving.tenants import tenant_for, tenant_policy
from pflash.trace import TraceWriter

log = logging.getLogger("ray.serve")


def _http_host() -> str | None:
    """The host Serve's HTTP proxies listen on, None when it cannot be told (then an
    anonymous `local` policy refuses to start). Serve offers it only on its controller
    client."""
    try:
        from ray.serve.context import _get_global_client

        return _get_global_client().http_config.host
    except Exception as exc:
        log.warning("the HTTP host could not be read: %s", type(exc).__name__)
        return None


# redirect_slashes off: a trailing slash is a 404 in the envelope, not a 307 to follow
app = FastAPI(
    title="PFlash", docs_url=None, redoc_url=None, openapi_url=None, redirect_slashes=False
)
install(app)  # request ids and error envelopes


class _DrafterHandle:
    """The DrafterScorer deployment as the flow's scorer: the response is returned unawaited,
    so the flow can hand it to the probe as an object ref; the conversation key routes it to
    the replica holding the conversation's scoring session."""

    def __init__(self, handle: DeploymentHandle):
        self.handle = handle

    def __call__(self, request: ScoreRequest, conversation: str):
        return self.handle.options(session_id=conversation).score.remote(request)


class _TargetHandle:
    """The TargetModel deployment as the answer path's `generate`: a stream routed by the
    conversation key to the replica holding its KV snapshots, which the target scopes by
    tenant (the key's prefix)."""

    def __init__(self, handle: DeploymentHandle):
        self.handle = handle

    def __call__(self, ids, params: SamplingParams, cut: int | None, conversation: str):
        stream = self.handle.options(stream=True, session_id=conversation)
        return stream.generate.remote(list(ids), params, cut, conversation, tenant_of(conversation))


class _ProbeHandle:
    """The SegmentProbe deployment as a `ProbeClient`."""

    def __init__(self, handle: DeploymentHandle):
        self.handle = handle

    async def params(self):
        return await self.handle.params.remote()

    async def segment(self, scored):
        # the drafter's response goes straight in: the tap travels as an object ref
        return await self.handle.segment.remote(scored)


def _replica_id() -> str:
    """This replica's id (`x-pflash-replica`), or "local" outside a replica."""
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:
        return "local"


@serve.deployment(name="Ingress", ray_actor_options={"num_cpus": 0.25}, max_ongoing_requests=64)
@serve.ingress(app)
class Ingress:
    def __init__(
        self,
        config: dict[str, Any],
        drafter: DeploymentHandle,
        target: DeploymentHandle,
        probe: DeploymentHandle | None = None,
    ):
        self._base = dict(config)
        self.config: PFlashConfig = build_config(self._base)
        target_tokenizer = load_tokenizer(self.config.target_tokenizer or self.config.target)
        drafter_tokenizer = load_tokenizer(self.config.drafter_tokenizer or self.config.drafter)
        self.target = target
        self.metrics = ServeMetrics()
        self.trace = TraceWriter(self.config.trace_path)
        self.compressor = Compressor(
            target_tokenizer=target_tokenizer,
            drafter_tokenizer=drafter_tokenizer,
            scorer=_DrafterHandle(drafter),
            probe=_ProbeHandle(probe) if probe is not None else None,
            store=SessionStoreClient(views_part(self.config)),
            max_context=self.config.max_context or self._target_context,
            record=self.metrics.record,
            trace=self.trace,
            offload=asyncio.to_thread,
        )
        self.gateway = Gateway(
            config=self.config,
            tenants=tenant_policy(self.config.security, _http_host()),
            target_tokenizer=target_tokenizer,
            compressor=self.compressor,
            generate=_TargetHandle(target),
            record=self.metrics.record,
            replica=_replica_id(),
        )
        checks = {
            "target": lambda: target.ready.remote(),
            "drafter": lambda: drafter.ready.remote(),
            "session_store": lambda: self.compressor.store.stats(),
        }
        if probe is not None:
            checks["probe"] = lambda: probe.params.remote()
        self.readiness = ReadinessCache(checks)
        freeze_startup_heap()

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Apply `user_config` live: every PFlash knob, validated like at startup. The
        session store gets its part (view capacity and TTL) and drops the views of the
        tenants whose API keys were removed."""
        old_keys, old_policy = self.config.api_keys, self.gateway.tenants
        self.config = build_config({**self._base, **(user_config or {})})
        self.gateway.configure(self.config, tenant_policy(self.config.security, _http_host()))
        revoked = set(old_keys) - set(self.config.api_keys)
        forget = [tenant_for(old_policy, f"Bearer {key}", None).id for key in revoked]
        self.compressor.store.configure(views_part(self.config), forget)
        if self.config.trace_path != self.trace.path:
            self.trace.close()
            self.trace = TraceWriter(self.config.trace_path)
            self.compressor.trace = self.trace

    async def _target_context(self) -> int:
        async with asyncio.timeout(self.config.remote_call_timeout_s):
            info = await self.target.info.remote()
        return int(info["max_context"])

    # ------------------------------------------------------------------ routes
    @app.get("/healthz")
    async def healthz(self) -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(self) -> JSONResponse:
        """Ready = every deployment of the graph (target, drafter, session store, probe)
        answered a check recently (`/healthz` only says this process lives); a 503 lists
        which did not. Answered from `pflash.serving.readiness`'s cache, which asks each
        deployment once per interval in the background, so a flood of probes sends no
        remote calls."""
        status, body = await self.readiness.answer()
        headers = {"Retry-After": str(RETRY_AFTER_S)} if status != 200 else None
        return JSONResponse(body, status_code=status, headers=headers)

    @app.get("/v1/models")
    async def models(self, request: Request):
        return await self.gateway.models(request, None)

    @app.get("/v1/models/{model_id:path}")
    async def model(self, request: Request, model_id: str):
        return await self.gateway.models(request, model_id)

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request):
        return await self.gateway.serve(request, ChatAnswer)

    @app.post("/v1/completions")
    async def completions(self, request: Request):
        return await self.gateway.serve(request, CompletionAnswer)

    @app.post("/v1/messages")
    async def messages(self, request: Request):
        """Anthropic Messages, served by the chat flow (`pflash.serving.messages`)."""
        return await self.gateway.serve(request, ChatAnswer, MESSAGES)

    @app.post("/v1/responses")
    async def responses(self, request: Request):
        """OpenAI Responses, served by the chat flow (`pflash.serving.responses`)."""
        return await self.gateway.serve(request, ChatAnswer, RESPONSES)

    @app.post("/v1/messages/count_tokens")
    async def count_message_tokens(self, request: Request):
        """Anthropic's token count."""
        return await self.gateway.count(request, MESSAGES_COUNT)

    @app.post("/v1/responses/input_tokens")
    async def count_response_tokens(self, request: Request):
        """The Responses API's token count."""
        return await self.gateway.count(request, RESPONSES_COUNT)
