"""What every route of the ingress delegates to: one request through the edge.

    authorize → read the body within its limits → admit (parse, overrides, output cap, the
    early prompt bound) → render once → plan (`Compressor.start`: the client's mistakes are
    a 4xx before any byte) → the answer path (`answer.Answers`), whole or streamed

within the server's deadline (`request_timeout_s`, whatever the client's headers say); and
the token counts and model listings, which stop at admission. An edge API's request runs as
its chat request (`edge`); chat completions and completions differ only in their `Answer`.
Errors escape to the middleware, which answers them in the API's envelope; the metric of a
failed request is recorded here, where it is known which step failed.

No Ray here: the ingress binds the `Compressor` (with the drafter, probe and store handles)
and the target's `generate`, and hands a live reconfigure's config and tenants to
`configure`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from pflash.compress.render.rendered import RenderedPrompt
from pflash.compress.text.encoding_memo import EncodingMemo
from pflash.config import AdmissionPart, PFlashConfig
from pflash.flow.compressor import Compressor
from pflash.flow.request import check_prompt_limit, compression_request, render_request
from pflash.models.target.protocol import SamplingParams
from pflash.serving.admission import TokenBound, check_prompt_bound, read_body, request_params
from pflash.serving.answer import Answer, Answers, Call, Generate, Record
from pflash.serving.chat_completion.serving import ChatAnswer
from pflash.serving.edge import Counted, Counter, Edge, Exchange
from pflash.serving.envelope import openai_frames
from pflash.serving.messages.translate import API_KEY_HEADER
from pflash.serving.middleware import request_id
from pflash.serving.models import listing
from pflash.serving.protocol import GenerationRequest, ResponseMeta
from pflash.serving.tenants import Tenant, TenantPolicy, check_return_prompt, tenant_for
from pflash.trace import trace_tenant

KEEPALIVE_AFTER_S = 1.0  # a stream starts with keep-alives when compression takes longer
PARSE_INLINE_BYTES = 64 << 10  # parsed on the event loop up to this: too quick to stall it


@dataclass(frozen=True)
class Admitted:
    """A request that passed admission: its `tenant`, the edge API's parsed request
    (`exchange`: an `Exchange`, a `Counted` for a token count, None for chat completions and
    completions), the `request` the flow runs, its `config` (the request's overrides
    applied), the sampling `params` the target gets and the rendered `prompt`."""

    tenant: Tenant
    exchange: Exchange | Counted | None
    request: GenerationRequest
    config: PFlashConfig
    params: SamplingParams
    prompt: RenderedPrompt


class Gateway:
    """The edge of one ingress replica. `config` and `tenants` are the live ones
    (`configure`); `replica` names the replica in `x-pflash-replica`, so an operator can
    follow a conversation's turns."""

    def __init__(
        self,
        *,
        config: PFlashConfig,
        tenants: TenantPolicy,
        target_tokenizer: Any,
        compressor: Compressor,
        generate: Generate,
        record: Record,
        replica: str,
    ) -> None:
        self.config, self.tenants = config, tenants
        self.target_tokenizer = target_tokenizer
        self.token_bound = TokenBound.of(target_tokenizer)  # None: no early prompt check
        # each tenant's conversations re-send their earlier turns: their pieces encode once
        self.encodings = EncodingMemo()
        self.compressor = compressor
        self.record = record
        self.replica = {"x-pflash-replica": replica}
        self.answers = Answers(
            generate,
            record,
            lambda compressed, session, accept: compressor.feedback(
                compressed, self.config, session, accept
            ),
        )

    def configure(self, config: PFlashConfig, tenants: TenantPolicy) -> None:
        self.config, self.tenants = config, tenants

    # ------------------------------------------------------------------ the routes' work

    async def serve(
        self, request: Request, answer: type[Answer], edge: Edge | None = None
    ) -> Response:
        """The request's answer: one JSON response, or a stream (its headers sent at once
        when compression takes longer than `KEEPALIVE_AFTER_S`, then keep-alives)."""
        started = time.perf_counter()
        try:
            admitted = await self._admit(request, answer, edge)
        except Exception:  # validation and rendering errors: 4xx before any model runs
            self.record("pflash_errors", stage="request")
            raise
        req, config, exchange = admitted.request, admitted.config, admitted.exchange
        deadline = asyncio.get_running_loop().time() + config.request_timeout_s
        job = compression_request(req, admitted.prompt, config, admitted.tenant.id, admitted.params)
        for tool in exchange.not_offered if exchange else ():
            self.record("pflash_tools_not_offered", tool=tool)
        async with asyncio.timeout_at(deadline):  # the client's mistakes: a 4xx before any byte
            pending = await self.compressor.start(job)
        call = Call(
            request_id=request_id(request),
            request=req,
            answer=answer,
            config=config.server,
            params=admitted.params,
            meta=ResponseMeta.new(req.model or config.served_model_names[0], answer.id_prefix),
            conversation=job.conversation,
            started=started,
            deadline=deadline,
            compression=asyncio.ensure_future(pending.finish()),
        )
        headers = {**self.replica, **(exchange.headers if exchange else {})}
        if req.stream:
            done, _ = await asyncio.wait({call.compression}, timeout=KEEPALIVE_AFTER_S)
            if not done:  # long prompt: start the stream now, keep the connection alive
                return self._stream(call, exchange, headers, keepalive=True)
        try:
            async with asyncio.timeout_at(deadline):
                await call.compression
        except Exception:
            call.compression.cancel()
            raise
        if req.stream:
            return self._stream(call, exchange, headers, keepalive=False)
        try:
            async with asyncio.timeout_at(deadline):
                response = await self.answers.whole(call)
            body, extra = (
                exchange.respond(response) if exchange else (response.model_dump(mode="json"), {})
            )
            return JSONResponse(body, headers={**headers, **extra})
        except Exception:
            self.record("pflash_errors", stage="target")
            raise

    async def count(self, request: Request, counter: Counter) -> JSONResponse:
        """The prompt's token count in the API's shape: no model runs. The count is what the
        chat flow would be given (the same render, the same encoding memo, so a count warms
        the request that follows it), accepted and refused as that request would be (a
        prompt over `max_prompt_tokens` is the same 400)."""
        try:
            admitted = await self._admit(request, ChatAnswer, counter)
        except Exception:  # validation and rendering errors: 4xx before any model runs
            self.record("pflash_errors", stage="request")
            raise
        return JSONResponse(counter.answer(len(admitted.prompt.ids)), headers=self.replica)

    async def models(self, request: Request, model_id: str | None) -> JSONResponse:
        """The served models (`model_id` None) or one of them (`models.listing`), in OpenAI's
        shape or, for a client that sends `anthropic-version`, Anthropic's. A client of
        either may send its key as `x-api-key`."""
        self.authorize(request, API_KEY_HEADER)
        config = self.config
        body = listing(
            config.served_model_names,
            model_id,
            request.headers,
            context=await self.compressor.max_context(),  # 503/504 if the target is down
            max_prompt_tokens=config.max_prompt_tokens,
            max_output_tokens=config.max_output_tokens,
        )
        return JSONResponse(body)

    def authorize(self, request: Request, key_header: str | None = None) -> Tenant:
        """The request's tenant (`tenants.tenant_for`); a 401 when keys do not match.
        `key_header`: where the API's clients send a bare key (Anthropic's `x-api-key`), read
        as a bearer token when the request has no `Authorization` (which wins)."""
        peer = request.client.host if request.client else None
        forwarded = ",".join(request.headers.getlist("x-forwarded-for"))
        credentials = _credentials(request.headers, key_header)
        return tenant_for(self.tenants, credentials, peer, forwarded)

    # ------------------------------------------------------------------ admission

    async def _admit(
        self, request: Request, answer: type[Answer], edge: Edge | Counter | None
    ) -> Admitted:
        """auth → body → parse → render. Raises the client's mistakes (4xx) before any model
        runs."""
        tenant = self.authorize(request, edge.api_key_header if edge is not None else None)
        trace_tenant(tenant.id)  # this request's task: its trace lines name it
        limits = self.config
        body = await read_body(
            request.stream(),
            limit=limits.max_body_bytes,
            timeout_s=limits.body_read_timeout_s,
            declared=request.headers.get("content-length"),
            disconnect=(ClientDisconnect,),
        )
        headers = dict(request.headers)
        if len(body) > PARSE_INLINE_BYTES:  # a large body is parsed off the event loop
            parsed = await asyncio.to_thread(self._parse, body, answer, edge, headers)
        else:
            parsed = self._parse(body, answer, edge, headers)
        exchange, req, config, params = parsed
        check_return_prompt(tenant, req.pflash_return_prompt)
        prompt = await asyncio.to_thread(
            render_request,
            req,
            answer.kind,
            self.target_tokenizer,
            memo=self.encodings,
            scope=tenant.id,
        )
        check_prompt_limit(prompt, config.server)
        return Admitted(tenant, exchange, req, config, params, prompt)

    def _parse(
        self,
        body: bytes,
        answer: type[Answer],
        edge: Edge | Counter | None,
        headers: Mapping[str, str],
    ) -> tuple[Exchange | Counted | None, GenerationRequest, PFlashConfig, SamplingParams]:
        """Parse and validate the body (an `edge` API's as its chat request; `headers`, where
        agent clients name their session), apply the request's overrides and the output
        cap, and refuse a prompt certain to exceed `max_prompt_tokens` before it is
        rendered: (the edge exchange or None, the request, its config, its sampling
        parameters)."""
        exchange = edge.parse(body, headers) if edge is not None else None
        req = exchange.chat if exchange is not None else answer.parse(body)
        config = self.config
        req.check_allowed(config.part(AdmissionPart))
        config = config.with_request_overrides(req.overrides())
        params = request_params(req, config.server)
        check_prompt_bound(req, answer.kind, self.token_bound, config.max_prompt_tokens)
        return exchange, req, config, params

    def _stream(
        self, call: Call, exchange: Exchange | None, headers: dict[str, str], *, keepalive: bool
    ) -> StreamingResponse:
        items = self.answers.stream(call, keepalive=keepalive)
        frames = exchange.stream(items) if exchange else openai_frames(items)
        return StreamingResponse(frames, media_type="text/event-stream", headers=headers)


def _credentials(headers: Headers, key_header: str | None) -> str | None:
    """The `Authorization` the tenant check reads: the request's own, else the bare key its
    API's clients send in `key_header`, as a bearer token."""
    key = headers.get(key_header) if key_header else None
    if key is None or "authorization" in headers:
        return headers.get("authorization")
    return "Bearer " + key
