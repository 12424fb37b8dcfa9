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
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from deployments.metrics import ServeMetrics
from deployments.resources import freeze_startup_heap
from deployments.session_store import STORE_NAME
from pflash.compress.encoding_memo import EncodingMemo
from pflash.compress.pipeline import Compressed
from pflash.compress.scoring import ScoreRequest
from pflash.compressor import (
    Compressor,
    Served,
    check_prompt_limit,
    compression_request,
    render_request,
    tenant_of,
    unwrap_remote_error,
)
from pflash.config import PFlashConfig, ViewsConfig, build_config
from pflash.errors import CompressionFailed, PFlashError, StageUnavailable
from pflash.models.source import load_tokenizer
from pflash.models.target.protocol import GenerationDone, SamplingParams, TokenDelta
from pflash.serving.admission import TokenBound, check_prompt_bound, read_body, request_params
from pflash.serving.chat_completion.serving import (
    chat_chunk,
    chat_response,
    chat_usage_chunk,
    parse_chat_request,
)
from pflash.serving.completion.serving import (
    completion_chunk,
    completion_response,
    completion_usage_chunk,
    parse_completion_request,
)
from pflash.serving.edge import ChatStreamItem, Counter, Edge, StreamError, chat_frames
from pflash.serving.envelope import SSE_KEEPALIVE, error_response, public_message
from pflash.serving.messages import translate as messages_api
from pflash.serving.messages.models import wants_anthropic
from pflash.serving.models import listing
from pflash.serving.protocol import ResponseMeta
from pflash.serving.readiness import RETRY_AFTER_S, ReadinessCache
from pflash.serving.responses import translate as responses_api
from pflash.serving.tenants import (
    Tenant,
    check_return_prompt,
    is_private,
    public_usage,
    tenant_for,
    tenant_policy,
)
from pflash.serving.tool_calls import ToolCallStream, split_tool_calls, tool_finish, with_index
from pflash.serving.usage import PFlashStats, ViewStats, build_usage
from pflash.trace import TraceWriter, trace_tenant

log = logging.getLogger("ray.serve")

KEEPALIVE_AFTER_S = 1.0  # a stream starts with keep-alives when compression takes longer
KEEPALIVE_EVERY_S = 2.0
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


def error_envelope(
    exc: BaseException, request_id: str | None = None
) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, body, headers) of the error envelope for `exc`. A 5xx tells the client only
    what failed (the stage, the runtime condition) and the request id; the exception's own
    text, which can name actors, hosts and internals, goes to the log line with that id."""
    err = unwrap_remote_error(exc)
    status, body = error_response(err)
    headers = {"x-request-id": request_id} if request_id else {}
    if status >= 500:
        message = body["error"]["message"]
        public = public_message(err)
        body["error"]["message"] = f"{public} (request id {request_id})" if request_id else public
        log.error(
            "request %s failed (%d): %s",
            request_id,
            status,
            message,
            exc_info=err if not isinstance(err, PFlashError) else None,
        )
    if status in (502, 503, 504):
        headers["Retry-After"] = str(getattr(err, "retry_after_s", None) or 1)
    return status, body, headers


def error_json(
    exc: BaseException, request_id: str | None = None, edge: Edge | None = None
) -> JSONResponse:
    """The error response; in the shape of `edge`'s API when the request came through one."""
    status, body, headers = error_envelope(exc, request_id)
    if edge is not None:
        body = edge.error(status, body)
        if edge.id_header and request_id:
            headers[edge.id_header] = request_id
    return JSONResponse(body, status_code=status, headers=headers or None)


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


def _framework_error(status: int, message: str, code: str) -> JSONResponse:
    """FastAPI's own 404/405 (and a body it could not read) in the OpenAI envelope."""
    error_type = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": error_type, "param": None, "code": code}}
    return JSONResponse(body, status_code=status)


@app.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 404:
        return _framework_error(404, f"no route {request.url.path}", "not_found")
    if exc.status_code == 405:
        return _framework_error(
            405,
            f"method {request.method} is not allowed on {request.url.path}",
            "method_not_allowed",
        )
    return _framework_error(exc.status_code, str(exc.detail), "http_error")


@app.exception_handler(RequestValidationError)
async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return _framework_error(400, "the request could not be read", "invalid_request")


class _DrafterHandle:
    """The DrafterScorer deployment as the flow's scorer: the response is returned unawaited,
    so the flow can hand it to the probe as an object ref; the conversation key routes it to
    the replica holding the conversation's scoring session."""

    def __init__(self, handle: DeploymentHandle):
        self.handle = handle

    def __call__(self, request: ScoreRequest, conversation: str):
        return self.handle.options(session_id=conversation).score.remote(request)


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
        checks = {
            "target": lambda: self.target.ready.remote(),
            "drafter": lambda: self._drafter.ready.remote(),
            "session_store": lambda: self.compressor.store._call("stats"),
        }
        if probe is not None:
            checks["probe"] = lambda: self._probe.params.remote()
        self.readiness = ReadinessCache(checks)
        try:  # sent as x-pflash-replica so an operator can follow a conversation's turns
            self.replica = serve.get_replica_context().replica_id.unique_id
        except Exception:
            self.replica = "local"
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
        anthropic = wants_anthropic(request.headers)
        try:
            self._authorize(_with_api_key(request))
            body = listing(
                self.config.served_model_names,
                model_id,
                request.headers,
                context=await self.compressor.max_context(),  # 503/504 if the target is down
                max_prompt_tokens=self.config.max_prompt_tokens,
                max_output_tokens=self.config.max_output_tokens,
            )
        except PFlashError as exc:  # 401, 404 model_not_found, the target's 503/504
            rid = "req-" + uuid.uuid4().hex[:16]
            return error_json(exc, rid, messages_api.EDGE if anthropic else None)
        return JSONResponse(body)

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request):
        return await self._serve(request, "chat")

    @app.post("/v1/completions")
    async def completions(self, request: Request):
        return await self._serve(request, "completion")

    @app.post("/v1/messages")
    async def messages(self, request: Request):
        """Anthropic Messages, served by the chat flow (`pflash.serving.messages`)."""
        return await self._serve(_with_api_key(request), "chat", messages_api.EDGE)

    @app.post("/v1/responses")
    async def responses(self, request: Request):
        """OpenAI Responses, served by the chat flow (`pflash.serving.responses`)."""
        return await self._serve(request, "chat", responses_api.EDGE)

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
        kind: str,
        edge: Edge | Counter | None = None,
        headers: Mapping[str, str] | None = None,
    ):
        """Parse and validate the body (an `edge` API's as its chat request, `headers` the
        request's, where agent clients name their session), apply the request's overrides
        and the output cap, and refuse a prompt certain to exceed `max_prompt_tokens` before
        it is rendered: (the edge exchange or None, the request, its config, its sampling
        parameters)."""
        exchange = edge.parse(body, headers) if edge is not None else None
        if exchange is not None:
            req = exchange.chat
        elif kind == "chat":
            req = parse_chat_request(body)
        else:
            req = parse_completion_request(body)
        config = self.config
        req.check_allowed(config)
        config = config.with_request_overrides(req.overrides())
        params = request_params(req, config)
        check_prompt_bound(req, kind, self.token_bound, config.max_prompt_tokens)
        return exchange, req, config, params

    def _headers(self, rid: str, edge: Edge | None) -> dict[str, str]:
        """A served answer's headers: the replica, the request id (and under the edge API's
        own name for it)."""
        headers = {"x-pflash-replica": self.replica, "x-request-id": rid}
        if edge is not None and edge.id_header:
            headers[edge.id_header] = rid
        return headers

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

    async def _accept(self, request: Request, kind: str, edge: Edge | Counter | None):
        """auth → body → parse → render: (tenant, edge exchange or None, request, its config,
        its sampling parameters, the rendered prompt). Raises the client's mistakes (4xx)
        before any model runs."""
        tenant, body = await self._read(request)
        headers = dict(request.headers)
        if len(body) > PARSE_INLINE_BYTES:  # a large body is parsed off the event loop
            exchange, req, config, params = await asyncio.to_thread(
                self._admit, body, kind, edge, headers
            )
        else:
            exchange, req, config, params = self._admit(body, kind, edge, headers)
        check_return_prompt(tenant, req.pflash_return_prompt)
        prompt = await asyncio.to_thread(
            render_request,
            req,
            kind,
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
        rid = "req-" + uuid.uuid4().hex[:16]
        try:
            *_, prompt = await self._accept(request, "chat", counter)
        except Exception as exc:  # validation and rendering errors: 4xx before any model runs
            self.metrics.record("pflash_errors", stage="request")
            return error_json(exc, rid, counter.edge)
        return JSONResponse(
            counter.answer(len(prompt.ids)), headers=self._headers(rid, counter.edge)
        )

    async def _serve(self, request: Request, kind: str, edge: Edge | None = None):
        """auth → parse → render → compress → stream (or one response), within the
        server's deadline (`request_timeout_s`, whatever the client's headers say). An
        `edge` API's request runs as its chat request; its answer and errors are translated
        back (`pflash.serving.edge`)."""
        started = time.perf_counter()
        rid = "req-" + uuid.uuid4().hex[:16]
        try:
            tenant, exchange, req, config, params, prompt = await self._accept(request, kind, edge)
        except Exception as exc:  # validation and rendering errors: 4xx before any model runs
            self.metrics.record("pflash_errors", stage="request")
            return error_json(exc, rid, edge)
        deadline = asyncio.get_running_loop().time() + config.request_timeout_s
        job = compression_request(req, prompt, config, tenant.id, params)
        key = job.conversation
        meta = ResponseMeta.new(req.model or config.served_model_names[0], kind)
        headers = {**self._headers(rid, edge), **(exchange.headers if exchange else {})}
        for tool in exchange.not_offered if exchange else ():
            self.metrics.record("pflash_tools_not_offered", tool=tool)
        try:  # planning raises the client's mistakes: a 4xx before any byte is sent
            async with asyncio.timeout_at(deadline):
                pending = await self.compressor.start(job)
        except Exception as exc:
            return error_json(exc, rid, edge)
        compression = asyncio.ensure_future(pending.finish())

        def stream(*, keepalive: bool) -> StreamingResponse:
            events = self._stream(
                req,
                kind,
                meta,
                compression,
                params,
                key,
                started,
                deadline,
                rid,
                keepalive=keepalive,
            )
            frames = exchange.stream(events) if exchange else chat_frames(events)
            return StreamingResponse(frames, media_type="text/event-stream", headers=headers)

        if req.stream:
            done, _ = await asyncio.wait({compression}, timeout=KEEPALIVE_AFTER_S)
            if not done:  # long prompt: start the stream now, keep the connection alive
                return stream(keepalive=True)
        try:
            async with asyncio.timeout_at(deadline):
                served = await compression
        except Exception as exc:
            compression.cancel()
            return error_json(exc, rid, edge)
        if req.stream:
            return stream(keepalive=False)
        try:
            async with asyncio.timeout_at(deadline):
                response = await self._respond(req, kind, meta, served, params, key, started)
            if exchange is None:
                return JSONResponse(response.model_dump(mode="json"), headers=headers)
            body, extra = exchange.respond(response)
            return JSONResponse(body, headers={**headers, **extra})
        except Exception as exc:
            self.metrics.record("pflash_errors", stage="target")
            return error_json(exc, rid, edge)

    def _callable(self, req, kind: str) -> frozenset[str]:
        """The functions whose hermes-format calls in the answer become `tool_calls`."""
        if kind != "chat" or self.config.tool_call_parser == "none":
            return frozenset()
        return req.callable_tools()

    def _stats(self, compressed: Compressed) -> PFlashStats:
        fields = {k: v for k, v in compressed.stats.items() if k in PFlashStats.model_fields}
        if isinstance(fields.get("view"), dict):
            fields["view"] = ViewStats(**fields["view"])
        return PFlashStats(**fields)

    def _account(
        self,
        kind: str,
        compressed: Compressed,
        done,
        ttft: float | None,
        started: float,
        session=None,
    ):
        """Usage for the response and the request's metrics, once the generation is done.

        When the target ran speculative decoding, its acceptance moves this session's
        adaptive keep ratio (§6.6): lower acceptance reads as lost context → keep more.
        """
        if done is None:
            raise CompressionFailed("target", "the target ended without finishing the generation")
        accept = getattr(done, "accept_rate", None)
        if session and accept is not None:
            asyncio.ensure_future(
                self.compressor.feedback(compressed, self.config, session, accept)
            )
        prompt_n = compressed.original_tokens
        usage = build_usage(prompt_n, done.timings, self._stats(compressed))
        ttft_s = ttft if ttft is not None else time.perf_counter() - started
        self._observe(compressed, prompt_n, ttft_s, done.timings.prompt_ms)
        tag = "true" if compressed.compressed else "false"
        self.metrics.record("pflash_requests", endpoint=kind, compressed=tag)
        return usage

    def _observe(
        self, compressed: Compressed, prompt_n: int, ttft_s: float, prefill_ms: float
    ) -> None:
        tag = "true" if compressed.compressed else "false"
        self.metrics.record("pflash_ttft_seconds", ttft_s, compressed=tag)
        self.metrics.record("pflash_target_prefill_seconds", prefill_ms / 1000.0, compressed=tag)
        self.metrics.record("pflash_input_tokens", prompt_n)
        self.metrics.record("pflash_kept_tokens", len(compressed.served_ids))
        self.metrics.record("pflash_keep_ratio", compressed.served_ratio)

    async def _generation(
        self, compressed: Compressed, params: SamplingParams, key: str, cut: int | None
    ) -> AsyncIterator[Any]:
        """The target's events, each within `remote_call_timeout_s` of the one before (the
        first within it of the call): a hung target is a 504 naming it, not a held request."""
        # the target scopes its prefix snapshots by tenant (the conversation key's prefix)
        events = self.target.options(stream=True, session_id=key).generate.remote(
            list(compressed.served_ids), params, cut, key, tenant_of(key)
        )
        gap_s = self.config.remote_call_timeout_s
        while True:
            try:
                async with asyncio.timeout(gap_s):
                    event = await events.__anext__()
            except StopAsyncIteration:
                return
            except TimeoutError:
                events.cancel()
                raise StageUnavailable("target", TimeoutError(f"no event for {gap_s} s")) from None
            yield event

    async def _respond(self, req, kind, meta, served: Served, params, key, started):
        text: list[str] = []
        done: GenerationDone | None = None
        ttft = None
        compressed = served.compressed
        async for event in self._generation(compressed, params, key, served.snapshot_cut):
            if isinstance(event, TokenDelta):
                ttft = ttft if ttft is not None else time.perf_counter() - started
                text.append(event.text)
            elif isinstance(event, GenerationDone):
                done = event
        usage = self._account(kind, compressed, done, ttft, started, session=req.session_id and key)
        usage = public_usage(usage, is_private(tenant_of(key)))
        prompt = compressed.served_text if req.pflash_return_prompt else None
        content, calls = split_tool_calls("".join(text), self._callable(req, kind))
        body = (
            chat_response(
                meta,
                content,
                tool_finish(done.finish_reason, calls),
                usage,
                tool_calls=calls,
                pflash_prompt=prompt,
            )
            if kind == "chat"
            else completion_response(
                meta, "".join(text), done.finish_reason, usage, pflash_prompt=prompt
            )
        )
        return body

    async def _stream(
        self, req, kind, meta, compression, params, key, started, deadline, rid, *, keepalive: bool
    ) -> AsyncIterator[ChatStreamItem]:
        try:
            async with asyncio.timeout_at(deadline):
                async for event in self._events(
                    req, kind, meta, compression, params, key, started, keepalive=keepalive
                ):
                    yield event
        except asyncio.CancelledError:
            compression.cancel()
            raise
        except Exception as exc:  # headers are sent: report in-band, then end the stream
            compression.cancel()
            status, body, _ = error_envelope(exc, rid)
            yield StreamError(status, body)

    async def _events(
        self, req, kind, meta, compression, params, key, started, *, keepalive: bool
    ) -> AsyncIterator[ChatStreamItem]:
        """The stream's items, framed by the caller: keep-alives while compressing, the
        answer's chunks, usage."""
        if keepalive:
            while True:
                done, _ = await asyncio.wait({compression}, timeout=KEEPALIVE_EVERY_S)
                if done:
                    break
                yield SSE_KEEPALIVE
        served: Served = await compression
        compressed = served.compressed
        prompt = compressed.served_text if req.pflash_return_prompt else None
        if kind == "chat":
            yield chat_chunk(meta, role="assistant", content="", pflash_prompt=prompt)
        ttft = None
        done_event: GenerationDone | None = None
        tools = ToolCallStream(self._callable(req, kind))  # holds back possible calls
        async for event in self._generation(compressed, params, key, served.snapshot_cut):
            if isinstance(event, TokenDelta):
                ttft = ttft if ttft is not None else time.perf_counter() - started
                text = tools.feed(event.text) if kind == "chat" else event.text
                if text:
                    chunk = (
                        chat_chunk(meta, content=text)
                        if kind == "chat"
                        else completion_chunk(meta, text)
                    )
                    yield chunk
            elif isinstance(event, GenerationDone):
                done_event = event
        if done_event is None:
            raise CompressionFailed("target", "the target ended without finishing the generation")
        rest, calls = tools.finish()
        if rest or calls:
            yield chat_chunk(meta, content=rest or None, tool_calls=with_index(calls))
        final = (
            chat_chunk(meta, finish_reason=tool_finish(done_event.finish_reason, calls))
            if kind == "chat"
            else completion_chunk(
                meta, finish_reason=done_event.finish_reason, pflash_prompt=prompt
            )
        )
        yield final
        usage = self._account(
            kind, compressed, done_event, ttft, started, session=req.session_id and key
        )
        usage = public_usage(usage, is_private(tenant_of(key)))
        if req.include_usage:
            chunk = (
                chat_usage_chunk(meta, usage)
                if kind == "chat"
                else completion_usage_chunk(meta, usage)
            )
            yield chunk
