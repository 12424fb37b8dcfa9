"""Ingress deployment: the OpenAI-compatible HTTP surface (FastAPI), stateless.

It carries; `pflash` decides. Per request:

    auth → parse (pflash.serving) → render once (pflash.compress.rendered)
    → await Compressor.start (plan: the client's mistakes are a 4xx before any byte)
    → Pending.finish (pflash.compressor: view, drafter, probe, select, fit)
    → TargetModel.generate (remote stream) → SSE / JSON

The Compressor reaches the DrafterScorer, SegmentProbe and SessionStore through the small
adapters below (Ray handles as async callables). Errors map to the OpenAI envelope in one
place (`pflash.serving.envelope.error_response`). `/v1/messages` (Anthropic) and `/v1/responses` run the
same flow: their request becomes a chat request at the edge, and the answer and errors are
translated back (`pflash.serving.messages`, `pflash.serving.responses`).
"""

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.requests import ClientDisconnect

from deployments.metrics import ServeMetrics
from deployments.resources import freeze_startup_heap
from deployments.session_store import STORE_NAME
from pflash.compress.encoding_memo import EncodingMemo
from pflash.compress.scoring import ScoreRequest
from pflash.compressor import (
    Compressor,
    check_prompt_limit,
    compression_request,
    render_request,
    tenant_of,
)
from pflash.config import PFlashConfig, ViewsConfig, build_config
from pflash.models.source import load_tokenizer
from pflash.models.target.protocol import SamplingParams
from pflash.serving.admission import TokenBound, check_prompt_bound, read_body, request_params
from pflash.serving.answer import Answer, Answers, Call
from pflash.serving.chat_completion.serving import ChatAnswer
from pflash.serving.completion.serving import CompletionAnswer
from pflash.serving.edge import Counter, Edge
from pflash.serving.envelope import openai_frames
from pflash.serving.messages import translate as messages_api
from pflash.serving.middleware import install, request_id
from pflash.serving.models import listing
from pflash.serving.protocol import ResponseMeta
from pflash.serving.readiness import RETRY_AFTER_S, ReadinessCache
from pflash.serving.responses import translate as responses_api
from pflash.serving.tenants import Tenant, check_return_prompt, tenant_for, tenant_policy
from pflash.trace import TraceWriter, trace_tenant

log = logging.getLogger("ray.serve")

KEEPALIVE_AFTER_S = 1.0  # a stream starts with keep-alives when compression takes longer
PARSE_INLINE_BYTES = 64 << 10  # bodies up to this are parsed on the event loop (< ~1 ms)


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


def _with_api_key(request: Request) -> Request:
    """Anthropic clients send their key as `x-api-key`; the tenant check reads
    `Authorization`, so the key is handed to it as a bearer token (an `Authorization` header
    the client sent wins)."""
    key = request.headers.get("x-api-key")
    if key is None or "authorization" in request.headers:
        return request
    scope = dict(request.scope)
    bearer = ("Bearer " + key).encode("latin-1")
    scope["headers"] = [*request.scope["headers"], (b"authorization", bearer)]
    return Request(scope, request.receive)


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


class _StoreActor:
    """The SessionStore deployment actor as a `StoreClient`, resolved on first use and again
    after a failure (the controller recreates it).

    The actor is created with the views config of the deploy (`build_app`); a live change
    (`user_config`) and the tenants of revoked API keys reach it through `configure`, and
    are pushed before the next call, also to a recreated actor, which starts from the
    deploy's config again."""

    def __init__(self, views: dict[str, Any]) -> None:
        self.actor = None
        self.views = views  # the live `ViewsConfig` keys
        self.forget: set[str] = set()  # tenants whose views to drop
        self._pushed = False

    def configure(self, views: dict[str, Any], forget: Iterable[str] = ()) -> None:
        self.views, self._pushed = views, False
        self.forget |= set(forget)

    async def _call(self, method: str, *args):
        try:
            if self.actor is None:
                self.actor = serve.get_deployment_actor(STORE_NAME)
                self._pushed = False
            if not self._pushed:
                forget = tuple(self.forget)
                await self.actor.reconfigure.remote(self.views, forget)
                self.forget -= set(forget)
                self._pushed = True
            return await getattr(self.actor, method).remote(*args)
        except Exception:
            self.actor = None
            raise

    async def lookup(self, tenant, keys):
        return await self._call("lookup", tenant, keys)

    async def remember(self, view):
        return await self._call("remember", view)

    async def keep_ratio(self, session, r0):
        return await self._call("keep_ratio", session, r0)

    async def report_acceptance(self, session, accept_rate, r0):
        return await self._call("report_acceptance", session, accept_rate, r0)


def _views_part(config: PFlashConfig) -> dict[str, Any]:
    """The session store's part of `config`: its `ViewsConfig` keys that differ from the
    defaults (what `build_app` gives the actor)."""
    return config.part(ViewsConfig).model_dump(mode="json", exclude_defaults=True)


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
        self.tenants = tenant_policy(self.config.security, _http_host())
        self.target_tokenizer = load_tokenizer(self.config.target_tokenizer or self.config.target)
        self.drafter_tokenizer = load_tokenizer(
            self.config.drafter_tokenizer or self.config.drafter
        )
        self.token_bound = TokenBound.of(self.target_tokenizer)  # None: no early prompt check
        # each tenant's conversations re-send their earlier turns: their pieces encode once
        self.encodings = EncodingMemo()
        self.target = target
        self._drafter, self._probe = drafter, probe
        self.metrics = ServeMetrics()
        self.trace = TraceWriter(self.config.trace_path)
        self.compressor = Compressor(
            target_tokenizer=self.target_tokenizer,
            drafter_tokenizer=self.drafter_tokenizer,
            scorer=_DrafterHandle(drafter),
            probe=_ProbeHandle(probe) if probe is not None else None,
            store=_StoreActor(_views_part(self.config)),
            max_context=self.config.max_context or self._target_context,
            record=self.metrics.record,
            trace=self.trace,
            offload=asyncio.to_thread,
        )
        self.answers = Answers(
            _TargetHandle(target),
            self.metrics.record,
            lambda compressed, session, accept: self.compressor.feedback(
                compressed, self.config, session, accept
            ),
        )
        checks = {
            "target": lambda: self.target.ready.remote(),
            "drafter": lambda: self._drafter.ready.remote(),
            "session_store": lambda: self.compressor.store._call("stats"),
        }
        if probe is not None:
            checks["probe"] = lambda: self._probe.params.remote()
        self.readiness = ReadinessCache(checks)
        try:  # sent as x-pflash-replica so an operator can follow a conversation's turns
            replica = serve.get_replica_context().replica_id.unique_id
        except Exception:
            replica = "local"
        self._replica = {"x-pflash-replica": replica}
        freeze_startup_heap()

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Apply `user_config` live: every PFlash knob, validated like at startup. The
        session store gets its part (view capacity and TTL) and drops the views of the
        tenants whose API keys were removed."""
        old_keys = self.config.api_keys
        self.config = build_config({**self._base, **(user_config or {})})
        old_policy = self.tenants
        self.tenants = tenant_policy(self.config.security, _http_host())
        revoked = set(old_keys) - set(self.config.api_keys)
        forget = [tenant_for(old_policy, f"Bearer {key}", None).id for key in revoked]
        self.compressor.store.configure(_views_part(self.config), forget)
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
        which did not. Answered from `pflash.serving.readiness`'s cache, which asks each deployment
        once per interval in the background, so a flood of probes sends no remote calls."""
        status, body = await self.readiness.answer()
        headers = {"Retry-After": str(RETRY_AFTER_S)} if status != 200 else None
        return JSONResponse(body, status_code=status, headers=headers)

    @app.get("/v1/models")
    async def models(self, request: Request) -> JSONResponse:
        return await self._models(request, None)

    @app.get("/v1/models/{model_id:path}")
    async def model(self, request: Request, model_id: str) -> JSONResponse:
        return await self._models(request, model_id)

    async def _models(self, request: Request, model_id: str | None) -> JSONResponse:
        """`listing`: OpenAI's shape, or Anthropic's for a client that sends
        `anthropic-version` (its errors too)."""
        self._authorize(_with_api_key(request))
        body = listing(
            self.config.served_model_names,
            model_id,
            request.headers,
            context=await self.compressor.max_context(),  # 503/504 if the target is down
            max_prompt_tokens=self.config.max_prompt_tokens,
            max_output_tokens=self.config.max_output_tokens,
        )
        return JSONResponse(body)

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request):
        return await self._serve(request, ChatAnswer)

    @app.post("/v1/completions")
    async def completions(self, request: Request):
        return await self._serve(request, CompletionAnswer)

    @app.post("/v1/messages")
    async def messages(self, request: Request):
        """Anthropic Messages, served by the chat flow (`pflash.serving.messages`)."""
        return await self._serve(_with_api_key(request), ChatAnswer, messages_api.EDGE)

    @app.post("/v1/responses")
    async def responses(self, request: Request):
        """OpenAI Responses, served by the chat flow (`pflash.serving.responses`)."""
        return await self._serve(request, ChatAnswer, responses_api.EDGE)

    @app.post("/v1/messages/count_tokens")
    async def count_message_tokens(self, request: Request):
        """Anthropic's token count (`pflash.serving.messages`)."""
        return await self._count(_with_api_key(request), messages_api.COUNT)

    @app.post("/v1/responses/input_tokens")
    async def count_response_tokens(self, request: Request):
        """The Responses API's token count (`pflash.serving.responses`)."""
        return await self._count(request, responses_api.COUNT)

    # ------------------------------------------------------------------ request flow
    def _authorize(self, request: Request) -> Tenant:
        """The request's tenant (`pflash.serving.tenants.tenant_for`); a 401 when keys do not match."""
        peer = request.client.host if request.client else None
        forwarded = ",".join(request.headers.getlist("x-forwarded-for"))
        return tenant_for(self.tenants, request.headers.get("authorization"), peer, forwarded)

    def _admit(
        self,
        body: bytes,
        answer: type[Answer],
        edge: Edge | Counter | None = None,
        headers: Mapping[str, str] | None = None,
    ):
        """Parse and validate the body (an `edge` API's as its chat request, `headers` the
        request's, where agent clients name their session), apply the request's overrides
        and the output cap, and refuse a prompt certain to exceed `max_prompt_tokens` before
        it is rendered: (the edge exchange or None, the request, its config, its sampling
        parameters)."""
        exchange = edge.parse(body, headers) if edge is not None else None
        req = exchange.chat if exchange is not None else answer.parse(body)
        config = self.config
        req.check_allowed(config)
        config = config.with_request_overrides(req.overrides())
        params = request_params(req, config)
        check_prompt_bound(req, answer.kind, self.token_bound, config.max_prompt_tokens)
        return exchange, req, config, params

    async def _read(self, request: Request) -> tuple[Tenant, bytes]:
        """The request's tenant and its body, within the body's size and time limits."""
        tenant = self._authorize(request)
        trace_tenant(tenant.id)  # this request's task: its trace lines name it
        body = await read_body(
            request.stream(),
            limit=self.config.max_body_bytes,
            timeout_s=self.config.body_read_timeout_s,
            declared=request.headers.get("content-length"),
            disconnect=(ClientDisconnect,),
        )
        return tenant, body

    async def _accept(self, request: Request, answer: type[Answer], edge: Edge | Counter | None):
        """auth → body → parse → render: (tenant, edge exchange or None, request, its config,
        its sampling parameters, the rendered prompt). Raises the client's mistakes (4xx)
        before any model runs."""
        tenant, body = await self._read(request)
        headers = dict(request.headers)
        if len(body) > PARSE_INLINE_BYTES:  # a large body is parsed off the event loop
            exchange, req, config, params = await asyncio.to_thread(
                self._admit, body, answer, edge, headers
            )
        else:
            exchange, req, config, params = self._admit(body, answer, edge, headers)
        check_return_prompt(tenant, req.pflash_return_prompt)
        prompt = await asyncio.to_thread(
            render_request,
            req,
            answer.kind,
            self.target_tokenizer,
            memo=self.encodings,
            scope=tenant.id,
        )
        check_prompt_limit(prompt, config)
        return tenant, exchange, req, config, params, prompt

    async def _count(self, request: Request, counter: Counter) -> JSONResponse:
        """The prompt's token count in the API's shape: no model runs. The count is what the
        chat flow would be given (the same render, the same encoding memo, so a count warms
        the request that follows it), accepted and refused as that request would be (a
        prompt over `max_prompt_tokens` is the same 400)."""
        try:
            *_, prompt = await self._accept(request, ChatAnswer, counter)
        except Exception:  # validation and rendering errors: 4xx before any model runs
            self.metrics.record("pflash_errors", stage="request")
            raise
        return JSONResponse(counter.answer(len(prompt.ids)), headers=self._replica)

    async def _serve(self, request: Request, answer: type[Answer], edge: Edge | None = None):
        """auth → parse → render → compress → stream (or one response), within the
        server's deadline (`request_timeout_s`, whatever the client's headers say). An
        `edge` API's request runs as its chat request; its answer and errors are translated
        back (`pflash.serving.edge`)."""
        started = time.perf_counter()
        try:
            tenant, exchange, req, config, params, prompt = await self._accept(
                request, answer, edge
            )
        except Exception:  # validation and rendering errors: 4xx before any model runs
            self.metrics.record("pflash_errors", stage="request")
            raise
        deadline = asyncio.get_running_loop().time() + config.request_timeout_s
        job = compression_request(req, prompt, config, tenant.id, params)
        headers = {**self._replica, **(exchange.headers if exchange else {})}
        for tool in exchange.not_offered if exchange else ():
            self.metrics.record("pflash_tools_not_offered", tool=tool)
        async with asyncio.timeout_at(deadline):  # the client's mistakes: a 4xx before any byte
            pending = await self.compressor.start(job)
        call = Call(
            request_id=request_id(request),
            request=req,
            answer=answer,
            config=config,
            params=params,
            meta=ResponseMeta.new(req.model or config.served_model_names[0], answer.id_prefix),
            conversation=job.conversation,
            started=started,
            deadline=deadline,
            compression=asyncio.ensure_future(pending.finish()),
        )

        def stream(*, keepalive: bool) -> StreamingResponse:
            items = self.answers.stream(call, keepalive=keepalive)
            frames = exchange.stream(items) if exchange else openai_frames(items)
            return StreamingResponse(frames, media_type="text/event-stream", headers=headers)

        if req.stream:
            done, _ = await asyncio.wait({call.compression}, timeout=KEEPALIVE_AFTER_S)
            if not done:  # long prompt: start the stream now, keep the connection alive
                return stream(keepalive=True)
        try:
            async with asyncio.timeout_at(deadline):
                await call.compression
        except Exception:
            call.compression.cancel()
            raise
        if req.stream:
            return stream(keepalive=False)
        try:
            async with asyncio.timeout_at(deadline):
                response = await self.answers.whole(call)
            if exchange is None:
                return JSONResponse(response.model_dump(mode="json"), headers=headers)
            body, extra = exchange.respond(response)
            return JSONResponse(body, headers={**headers, **extra})
        except Exception:
            self.metrics.record("pflash_errors", stage="target")
            raise
