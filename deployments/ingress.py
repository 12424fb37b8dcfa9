"""Ingress deployment: the OpenAI-compatible HTTP surface (FastAPI), stateless.

It owns both tokenizers (cheap) and calls pflash for every decision; models live in the
DrafterScorer and TargetModel deployments. Per request:

    validate → render → prepare (plan, budget, gate) → drafter.score (remote)
    → finish (select, assemble, ceiling) → target.generate (remote stream) → SSE / JSON

Errors map to the OpenAI envelope in one place (`pflash.api.error_response`). A drafter
failure fails closed unless the operator chose `on_drafter_error: bypass`.
"""

import asyncio
import functools
import hashlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.metrics import ServeMetrics
from deployments.session_store import STORE_NAME
from pflash import api
from pflash.compress.budget import configured_keep_ratio
from pflash.compress.chat import render_chat
from pflash.compress.pipeline import (
    Compressed,
    PromptInput,
    finish,
    prepare,
    scorer_failure_action,
    uncompressed,
)
from pflash.config import PFlashConfig, build_config
from pflash.errors import CompressionFailed, InvalidRequest, PFlashError
from pflash.models.source import load_tokenizer
from pflash.models.target.protocol import GenerationDone, SamplingParams, TokenDelta
from pflash.trace import TraceWriter
from pflash.views.decision import decide_view, served_result, view_keys

log = logging.getLogger("ray.serve")

KEEPALIVE_AFTER_S = 1.0  # a stream starts with keep-alives when compression takes longer
KEEPALIVE_EVERY_S = 2.0
STRIPPED_HEADERS = ("x-request-timeout-seconds", "x-request-disconnect-disabled")

app = FastAPI(title="PFlash", docs_url=None, redoc_url=None)


def unwrap_remote_error(exc: BaseException) -> BaseException:
    """The original exception behind a Ray task error (its attributes intact)."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def error_json(exc: BaseException) -> JSONResponse:
    err = unwrap_remote_error(exc)
    status, body = api.error_response(err)
    if status >= 500 and not isinstance(err, PFlashError):
        log.error("unexpected error serving a request", exc_info=err)
    headers = {"Retry-After": "1"} if status == 503 else None
    return JSONResponse(body, status_code=status, headers=headers)


def conversation_key(
    tenant: str, session_id: str | None, messages: list[dict] | None, prompt_ids: tuple[int, ...]
) -> str:
    """Affinity key: the client's session id, else tenant + hash of the conversation's start
    (up to the end of the first user turn), so every turn of a chat maps to the same key."""
    if session_id:
        return f"{tenant}:{session_id}"
    h = hashlib.sha256(tenant.encode())
    if messages:
        head = []
        for m in messages:
            head.append({"role": m.get("role"), "content": m.get("content")})
            if m.get("role") == "user":
                break
        h.update(json.dumps(head, sort_keys=True, default=str).encode())
    else:
        h.update(repr(prompt_ids[:256]).encode())
    return f"{tenant}:{h.hexdigest()[:24]}"


@dataclass(frozen=True)
class Served:
    """What the target is asked to prefill, and where its KV snapshot may be cut (target
    tokens: the generation-prompt start, so the next turn extends the snapshot)."""

    compressed: Compressed
    snapshot_cut: int | None


def _passthrough(prompt_ids: tuple[int, ...], prompt_text: str) -> Compressed:
    """pflash_mode off: serve the prompt as sent, without planning it."""
    stats = {"compressed_tokens": len(prompt_ids), "keep_ratio": 1.0, "stop_reason": "mode_off"}
    return Compressed(
        False, tuple(prompt_ids), prompt_text, (), (), stats, None, "mode_off", len(prompt_ids)
    )


def _too_large(limit: int) -> PFlashError:
    exc = PFlashError(f"request body exceeds {limit} bytes", param=None, code="request_too_large")
    exc.http_status, exc.error_type = 413, "invalid_request_error"
    return exc


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
        self.target_tokenizer = load_tokenizer(self.config.target_tokenizer or self.config.target)
        self.drafter_tokenizer = load_tokenizer(
            self.config.drafter_tokenizer or self.config.drafter
        )
        self.drafter = drafter
        self.target = target
        self.probe = probe  # SegmentProbe, when a probe is configured
        self.probe_params = None  # its cut parameters, fetched on first use
        self.metrics = ServeMetrics()
        self.trace = TraceWriter(self.config.trace_path)
        self._max_context: int | None = self.config.max_context
        self.model_name = self.config.upstream_model or self.config.target
        self.store = None  # the SessionStore deployment actor, resolved on first use
        try:  # sent as x-pflash-replica so an operator can follow a conversation's turns
            self.replica = serve.get_replica_context().replica_id.unique_id
        except Exception:
            self.replica = "local"

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Apply `user_config` live: every PFlash knob, validated like at startup."""
        self.config = build_config({**self._base, **(user_config or {})})
        if self.config.trace_path != self.trace.path:
            self.trace.close()
            self.trace = TraceWriter(self.config.trace_path)

    async def max_context(self) -> int:
        if self._max_context is None:
            info = await self.target.info.remote()
            self._max_context = int(info["max_context"])
        return self._max_context

    # ------------------------------------------------------------------ routes
    @app.get("/healthz")
    async def healthz(self) -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models(self, request: Request) -> JSONResponse:
        try:
            self._authorize(request)
        except PFlashError as exc:
            return error_json(exc)
        card = api.ModelCard(id=self.model_name, max_model_len=await self.max_context())
        return JSONResponse(api.ModelList(data=[card]).model_dump(exclude_none=True))

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request):
        return await self._serve(request, "chat")

    @app.post("/v1/completions")
    async def completions(self, request: Request):
        return await self._serve(request, "completion")

    # ------------------------------------------------------------------ request flow
    def _authorize(self, request: Request) -> str:
        """The tenant of the request's API key ("anonymous" when keys are off)."""
        keys = self.config.api_keys
        if not keys:
            return "anonymous"
        header = request.headers.get("authorization", "")
        token = header[7:].strip() if header.lower().startswith("bearer ") else ""
        for key in keys:
            if hmac.compare_digest(token.encode(), key.encode()):
                return "key-" + hashlib.sha256(key.encode()).hexdigest()[:16]
        exc = PFlashError("invalid or missing API key", code="invalid_api_key")
        exc.http_status, exc.error_type = 401, "authentication_error"
        raise exc

    async def _read_body(self, request: Request) -> bytes:
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise _too_large(limit)
        body = b""
        async for part in request.stream():
            body += part
            if len(body) > limit:
                raise _too_large(limit)
        return body

    async def _serve(self, request: Request, kind: str):
        started = time.perf_counter()
        try:
            tenant = self._authorize(request)
            body = await self._read_body(request)
            req = (
                api.parse_chat_request(body)
                if kind == "chat"
                else api.parse_completion_request(body)
            )
            config = self.config
            req.check_allowed(config)
            config = config.with_request_overrides(
                mode=req.pflash_mode, keep_ratio=req.pflash_keep_ratio
            )
            params = req.sampling_params()
            job = await asyncio.to_thread(self._render, req, kind)
        except Exception as exc:  # validation and rendering errors: 4xx before any model runs
            self.metrics.record("pflash_errors", stage="request")
            return error_json(exc)
        prompt_ids, messages, snapshot_cut = job
        key = conversation_key(tenant, req.session_id, messages, prompt_ids)
        compression = asyncio.ensure_future(
            self._compress(
                req, kind, config, prompt_ids, messages, params, key, tenant, snapshot_cut
            )
        )
        if req.stream:
            done, _ = await asyncio.wait({compression}, timeout=KEEPALIVE_AFTER_S)
            if not done:  # long prompt: start the stream now, keep the connection alive
                return StreamingResponse(
                    self._stream(req, kind, compression, params, key, started, keepalive=True),
                    media_type="text/event-stream",
                    headers={"x-pflash-replica": self.replica},
                )
        try:
            served = await compression
        except Exception as exc:
            return error_json(exc)
        if req.stream:
            return StreamingResponse(
                self._stream(req, kind, compression, params, key, started, keepalive=False),
                media_type="text/event-stream",
                headers={"x-pflash-replica": self.replica},
            )
        try:
            return await self._respond(req, kind, served, params, key, started)
        except Exception as exc:
            self.metrics.record("pflash_errors", stage="target")
            return error_json(exc)

    def _render(self, req, kind: str) -> tuple[tuple[int, ...], list[dict] | None, int | None]:
        """Target prompt tokens, the chat messages, and the generation-prompt start (the KV
        snapshot cut: the next turn of this conversation extends everything before it)."""
        tok = self.target_tokenizer
        if kind == "completion":
            if isinstance(req.prompt, list):
                vocab = len(tok)
                if any(t < 0 or t >= vocab for t in req.prompt):
                    raise InvalidRequest(
                        f"prompt token ids must be in [0, {vocab})", param="prompt"
                    )
                return tuple(req.prompt), None, None
            return tuple(tok(req.prompt, add_special_tokens=True)["input_ids"]), None, None
        messages = req.template_messages()
        tools = req.template_tools()
        kwargs = dict(req.chat_template_kwargs or {})
        thinking = kwargs.pop("enable_thinking", None)
        text = render_chat(
            tok, messages, tools=tools, enable_thinking=thinking, template_kwargs=kwargs
        )
        ids = tuple(tok(text, add_special_tokens=False)["input_ids"])
        head = render_chat(
            tok,
            messages,
            tools=tools,
            enable_thinking=thinking,
            template_kwargs=kwargs,
            add_generation_prompt=False,
        )
        head_ids = tok(head, add_special_tokens=False)["input_ids"]
        cut = (
            len(head_ids)
            if 0 < len(head_ids) < len(ids) and tuple(head_ids) == ids[: len(head_ids)]
            else None
        )
        return ids, messages, cut

    async def _compress(
        self,
        req,
        kind,
        config: PFlashConfig,
        prompt_ids,
        messages,
        params: SamplingParams,
        key: str,
        tenant: str = "anonymous",
        render_cut: int | None = None,
    ) -> Served:
        """Plan → (view) → drafter → select/assemble; fail closed (or bypass when chosen)."""
        max_ctx = await self.max_context()
        max_output = params.max_tokens or 0
        kw = dict(
            config=config,
            target_tokenizer=self.target_tokenizer,
            drafter_tokenizer=self.drafter_tokenizer,
        )
        cut = render_cut
        if config.mode == "off":
            text = (
                self.target_tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
                if req.pflash_return_prompt
                else ""
            )
            result = _passthrough(prompt_ids, text)
        else:
            r0 = configured_keep_ratio(config, len(prompt_ids))
            if config.adaptive_keep and req.session_id:
                r0 = await self._store_call("keep_ratio", key, r0, default=r0)
            inp = PromptInput(
                prompt_ids=prompt_ids,
                messages=messages,
                tools=req.template_tools() if kind == "chat" else None,
                chat_template_kwargs=getattr(req, "chat_template_kwargs", None),
                pflash_query=req.pflash_query,
                pflash_required=tuple(req.pflash_required or ()),
                max_output=max_output,
                max_context=max_ctx,
                session_key=key,
                r0=r0,
            )
            prepared = await asyncio.to_thread(prepare, inp, **kw)
            if kind == "chat" and config.chat_view and config.strict:
                result, view_cut = await self._serve_view(prepared, config, key, tenant, kw)
                cut = view_cut if result.compressed else render_cut
            else:
                result = await self._fresh(prepared, config, key, kw)
                cut = None if result.compressed else render_cut  # render_cut indexes the raw prompt
        served = len(result.served_ids)
        if served + max(1, max_output) > max_ctx:
            raise InvalidRequest(
                f"the prompt ({served} tokens served of {len(prompt_ids)}) plus max_tokens ({max_output}) "
                f"exceeds the context ({max_ctx}); compress it (pflash_mode) or shorten it",
                param="messages" if kind == "chat" else "prompt",
                code="context_length_exceeded",
            )
        return Served(result, cut)

    async def _fresh(self, prepared, config: PFlashConfig, key: str, kw: dict) -> Compressed:
        """A fresh compression (the drafter runs), or the prompt as is when the gate declined."""
        if not prepared.compress:
            self.metrics.record("pflash_bypasses", reason=prepared.reason)
            return uncompressed(prepared)
        try:
            response = self.drafter.options(session_id=key).score.remote(prepared.score_request)
            boundary = subunit = None
            if self.probe is not None and prepared.score_request.want_tap:
                if self.probe_params is None:
                    self.probe_params = await self.probe.params.remote()
                # the drafter's response goes straight in: the tap travels as an object ref
                boundary, subunit = await self.probe.segment.remote(response)
            scores = await response
            result = await asyncio.to_thread(
                finish,
                prepared,
                scores,
                trace=self.trace,
                boundary=boundary,
                subunit=subunit,
                probe_params=self.probe_params,
                **kw,
            )
        except Exception as exc:
            err = unwrap_remote_error(exc)
            stage = err.stage if isinstance(err, CompressionFailed) else "drafter"
            self.metrics.record("pflash_errors", stage=stage)
            if scorer_failure_action(stage, config) == "bypass":
                log.warning(
                    "drafter failed, serving uncompressed (on_drafter_error=bypass): %s", err
                )
                self.metrics.record("pflash_bypasses", reason="drafter_error")
                return uncompressed(prepared)
            if isinstance(err, CompressionFailed):
                raise err from None
            raise CompressionFailed("drafter", f"{type(err).__name__}: {err}") from None
        self.metrics.record(
            "pflash_compression_seconds", result.stats.get("compress_ms", 0.0) / 1000.0
        )
        self.metrics.record("pflash_drafter_forward_seconds", scores.scorer_forward_ms / 1000.0)
        return result

    async def _serve_view(self, prepared, config: PFlashConfig, key: str, tenant: str, kw: dict):
        """The multi-turn path (§6.1): look the conversation's view up, decide, run the
        drafter only when the decision needs a fresh compression, remember the new view."""
        keys = view_keys(prepared, self.target_tokenizer)
        view = await self._store_call("lookup", tenant, keys, default=None)
        decide = functools.partial(
            decide_view,
            tenant=tenant,
            conversation=key,
            config=config,
            target_tokenizer=self.target_tokenizer,
            drafter_tokenizer=self.drafter_tokenizer,
        )
        decision = await asyncio.to_thread(decide, prepared, view, None, now=time.time())
        fresh = None
        if decision.needs_compression:
            fresh = await self._fresh(prepared, config, key, kw)
            decision = await asyncio.to_thread(decide, prepared, view, fresh, now=time.time())
        if decision.view is not None:
            await self._store_call("remember", decision.view, default=None)
        self.metrics.record("pflash_view_outcomes", mode=decision.mode)
        if decision.recalled_tokens:
            self.metrics.record("pflash_recalled_tokens", decision.recalled_tokens)
        if decision.mode == "rebuild":
            self.metrics.record("pflash_rebuilds", reason=decision.reason or "rebuild")
        return served_result(decision, prepared, fresh), decision.snapshot_cut

    async def _store_call(self, method: str, *args, default):
        """Call the session store; views are a cache, so a failed call means "no view"."""
        try:
            if self.store is None:
                self.store = serve.get_deployment_actor(STORE_NAME)
            return await getattr(self.store, method).remote(*args)
        except Exception as exc:
            log.warning("session store %s failed (%s); continuing without it", method, exc)
            self.store = None
            return default

    def _stats(self, compressed: Compressed) -> api.PFlashStats:
        fields = {k: v for k, v in compressed.stats.items() if k in api.PFlashStats.model_fields}
        if isinstance(fields.get("view"), dict):
            fields["view"] = api.ViewStats(**fields["view"])
        return api.PFlashStats(**fields)

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
        if session and accept is not None and compressed.compressed and self.config.adaptive_keep:
            r0 = configured_keep_ratio(self.config, compressed.original_tokens)
            asyncio.ensure_future(
                self._store_call("report_acceptance", session, accept, r0, default=None)
            )
        prompt_n = compressed.original_tokens
        usage = api.build_usage(prompt_n, done.timings, self._stats(compressed))
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
        self.metrics.record("pflash_keep_ratio", len(compressed.served_ids) / max(1, prompt_n))

    def _generation(
        self, compressed: Compressed, params: SamplingParams, key: str, cut: int | None
    ):
        return self.target.options(stream=True, session_id=key).generate.remote(
            list(compressed.served_ids), params, cut, key
        )

    async def _respond(self, req, kind, served: Served, params, key, started) -> JSONResponse:
        meta = api.ResponseMeta.new(req.model or self.model_name, kind)
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
        prompt = compressed.served_text if req.pflash_return_prompt else None
        body = (
            api.chat_response(meta, "".join(text), done.finish_reason, usage, pflash_prompt=prompt)
            if kind == "chat"
            else api.completion_response(
                meta, "".join(text), done.finish_reason, usage, pflash_prompt=prompt
            )
        )
        return JSONResponse(
            body.model_dump(mode="json"), headers={"x-pflash-replica": self.replica}
        )

    async def _stream(
        self, req, kind, compression, params, key, started, *, keepalive: bool
    ) -> AsyncIterator[str]:
        meta = api.ResponseMeta.new(req.model or self.model_name, kind)
        try:
            if keepalive:
                while True:
                    done, _ = await asyncio.wait({compression}, timeout=KEEPALIVE_EVERY_S)
                    if done:
                        break
                    yield api.SSE_KEEPALIVE
            served: Served = await compression
            compressed = served.compressed
            prompt = compressed.served_text if req.pflash_return_prompt else None
            if kind == "chat":
                yield api.sse_event(
                    api.chat_chunk(meta, role="assistant", content="", pflash_prompt=prompt)
                )
            ttft = None
            done_event: GenerationDone | None = None
            async for event in self._generation(compressed, params, key, served.snapshot_cut):
                if isinstance(event, TokenDelta):
                    ttft = ttft if ttft is not None else time.perf_counter() - started
                    if event.text:
                        chunk = (
                            api.chat_chunk(meta, content=event.text)
                            if kind == "chat"
                            else api.completion_chunk(meta, event.text)
                        )
                        yield api.sse_event(chunk)
                elif isinstance(event, GenerationDone):
                    done_event = event
            if done_event is None:
                raise CompressionFailed(
                    "target", "the target ended without finishing the generation"
                )
            final = (
                api.chat_chunk(meta, finish_reason=done_event.finish_reason)
                if kind == "chat"
                else api.completion_chunk(
                    meta, finish_reason=done_event.finish_reason, pflash_prompt=prompt
                )
            )
            yield api.sse_event(final)
            usage = self._account(
                kind, compressed, done_event, ttft, started, session=req.session_id and key
            )
            if req.include_usage:
                chunk = (
                    api.chat_usage_chunk(meta, usage)
                    if kind == "chat"
                    else api.completion_usage_chunk(meta, usage)
                )
                yield api.sse_event(chunk)
            yield api.SSE_DONE
        except asyncio.CancelledError:
            compression.cancel()
            raise
        except Exception as exc:  # headers are sent: report in-band, then end the stream
            log.warning("stream failed: %s", exc)
            yield api.sse_error(unwrap_remote_error(exc))
            yield api.SSE_DONE
