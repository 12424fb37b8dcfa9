"""The error envelope: the one place where exceptions become HTTP statuses and
`{"error": {"message", "type", "param", "code"}}` bodies, and SSE framing (events,
keep-alives, an in-band error once a stream has started)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from pflash.api.requests import invalid_request_from
from pflash.errors import PFlashError

# ---------------------------------------------------------------------- errors and SSE


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """`{"error": {"message", "type", "param", "code"}}`: OpenAI's error envelope."""

    error: ErrorDetail


# Errors of the serving runtime, matched by class name so this module needs no Ray import:
# (status, type, code, message prefix). Walked along the exception's MRO.
_RUNTIME_ERRORS: dict[str, tuple[int, str, str, str]] = {
    "BackPressureError": (
        503,
        "overloaded_error",
        "backpressure",
        "server overloaded, retry later",
    ),
    "DeploymentUnavailableError": (
        503,
        "service_unavailable",
        "replica_unavailable",
        "service unavailable",
    ),
    "ReplicaUnavailableError": (
        503,
        "service_unavailable",
        "replica_unavailable",
        "service unavailable",
    ),
    "RayActorError": (
        503,
        "service_unavailable",
        "replica_unavailable",
        "a model replica died, retry",
    ),
    "TimeoutError": (504, "timeout_error", "timeout", "timed out"),
}


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
        known = next(
            (
                _RUNTIME_ERRORS[c.__name__]
                for c in type(exc).__mro__
                if c.__name__ in _RUNTIME_ERRORS
            ),
            None,
        )
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


SSE_DONE = "data: [DONE]\n\n"
SSE_KEEPALIVE = ": keep-alive\n\n"


def sse_event(obj: BaseModel | Mapping[str, Any]) -> str:
    """One server-sent event carrying `obj` as compact JSON."""
    if isinstance(obj, BaseModel):
        payload = obj.model_dump_json()
    else:
        payload = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return f"data: {payload}\n\n"


def sse_error(exc: BaseException) -> str:
    """A mid-stream failure as an SSE event with the error envelope (the status is already sent)."""
    return sse_event(error_response(exc)[1])
