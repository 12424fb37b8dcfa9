"""The error envelope: the one place where exceptions become HTTP statuses and
`{"error": {"message", "type", "param", "code"}}` bodies, and SSE framing (events,
keep-alives, an in-band error once a stream has started)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from pflash.errors import PFlashError, runtime_failure
from pflash.serving.validation import invalid_request_from

# ---------------------------------------------------------------------- errors and SSE


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """`{"error": {"message", "type", "param", "code"}}`: OpenAI's error envelope."""

    error: ErrorDetail


def error_response(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """The HTTP status and OpenAI error body for any exception. The only such mapping.

    `PFlashError`s carry their own status/type/param/code; a pydantic `ValidationError`
    is a 400 naming the field; serving-runtime failures (backpressure, a dead replica, a
    timeout) are 503/504; anything else is a 500 that names only the exception class.
    """
    if isinstance(exc, ValidationError):
        exc = invalid_request_from(exc)
    if isinstance(exc, PFlashError):
        status, detail = (
            exc.http_status,
            ErrorDetail(message=exc.message, type=exc.error_type, param=exc.param, code=exc.code),
        )
    else:
        known = runtime_failure(exc)
        if known is not None:
            status, error_type, code, prefix = known
            detail = ErrorDetail(
                message=f"{prefix}: {exc}" if str(exc) else prefix, type=error_type, code=code
            )
        else:
            status = 500
            detail = ErrorDetail(
                message=f"internal server error ({type(exc).__name__})", type="server_error"
            )
    return status, ErrorResponse(error=detail).model_dump()


def public_message(exc: BaseException) -> str:
    """What a client is told about a 5xx: the stage or runtime condition, never the
    exception's own text (it can name actors, hosts and internals)."""
    if isinstance(exc, PFlashError):
        return exc.public_message
    known = runtime_failure(exc)
    return known[3] if known else f"internal server error ({type(exc).__name__})"


SSE_DONE = "data: [DONE]\n\n"
SSE_KEEPALIVE = ": keep-alive\n\n"


def sse_event(obj: BaseModel | Mapping[str, Any]) -> str:
    """One server-sent event carrying `obj` as compact JSON."""
    if isinstance(obj, BaseModel):
        payload = obj.model_dump_json()
    else:
        payload = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return f"data: {payload}\n\n"
