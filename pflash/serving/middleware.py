"""What every HTTP request gets before and after its route: an id, and an error that escapes
the route answered in its API's envelope. Routes neither make ids nor build error bodies.

The id (`req-` + 16 hex digits) is made here, once per request, put where routes read it
(`request_id`) and sent on every response as `x-request-id`, and as `request-id` to the
Anthropic clients, whose SDKs read it there. An exception that escapes a route before its
response started becomes the error envelope (`envelope.error_envelope`: a 5xx says only
what failed and the id, 502/503/504 carry `Retry-After`): OpenAI's, or Anthropic's on the
Messages routes and for a model listing asked with `anthropic-version` (Claude Code lists a
gateway's models so). Once a response has started (a stream), its route reports a failure
in-band itself. FastAPI's own errors (no such route, a wrong method, a request it could not
read) are OpenAI's envelope on every route.
"""

from __future__ import annotations

import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pflash.serving.envelope import error_envelope, http_error
from pflash.serving.messages.models import wants_anthropic
from pflash.serving.messages.translate import error_body as anthropic_error

ID_HEADER = b"x-request-id"
ANTHROPIC_ID_HEADER = b"request-id"
ANTHROPIC_ROUTES = frozenset({"/v1/messages", "/v1/messages/count_tokens"})
MODELS_ROUTE = "/v1/models"


def new_request_id() -> str:
    return "req-" + uuid.uuid4().hex[:16]


def request_id(request: Request) -> str:
    """The id the middleware gave `request`."""
    return request.state.request_id


def speaks_anthropic(scope: Scope) -> bool:
    """Whether the request's client reads Anthropic's errors and request-id header: a
    Messages route, or a model listing that sent `anthropic-version`."""
    root, path = scope.get("root_path", ""), scope["path"]
    if root and path.startswith(root):
        path = path[len(root) :]
    if path in ANTHROPIC_ROUTES:
        return True
    listing = path == MODELS_ROUTE or path.startswith(MODELS_ROUTE + "/")
    return listing and wants_anthropic(Headers(scope=scope))


class EnvelopeMiddleware:
    """The request id and the error envelope of every HTTP request (the module docstring
    says which); a pure ASGI middleware, so streamed responses pass through untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = new_request_id()
        scope["state"] = {**scope.get("state", {}), "request_id": rid}
        anthropic = speaks_anthropic(scope)
        ids = [(ID_HEADER, rid.encode())]
        if anthropic:
            ids.append((ANTHROPIC_ID_HEADER, rid.encode()))
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = [*ids, *message.get("headers", ())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception as exc:
            if started:  # the stream's own route reports in-band; nothing more can be sent
                raise
            status, body, headers = error_envelope(exc, rid)
            if anthropic:
                body = anthropic_error(status, body)
            response = JSONResponse(body, status_code=status, headers=headers)
            await response(scope, receive, send_with_id)


def install(app: FastAPI) -> None:
    """`EnvelopeMiddleware` on `app`, and FastAPI's own errors in OpenAI's envelope."""
    app.add_middleware(EnvelopeMiddleware)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _unreadable)


def _framework_error(request: Request, status: int, message: str, code: str) -> JSONResponse:
    status, body, headers = error_envelope(http_error(status, message, code), request_id(request))
    return JSONResponse(body, status_code=status, headers=headers)


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    path = request.url.path
    if exc.status_code == 404:
        return _framework_error(request, 404, f"no route {path}", "not_found")
    if exc.status_code == 405:
        message = f"method {request.method} is not allowed on {path}"
        return _framework_error(request, 405, message, "method_not_allowed")
    return _framework_error(request, exc.status_code, str(exc.detail), "http_error")


async def _unreadable(request: Request, exc: RequestValidationError) -> JSONResponse:
    return _framework_error(request, 400, "the request could not be read", "invalid_request")
