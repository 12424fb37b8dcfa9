"""The error envelope: the one place where exceptions become HTTP statuses and
`{"error": {"message", "type", "param", "code"}}` bodies, and SSE framing (events,
keep-alives, an in-band error once a stream has started)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from pflash.errors import PFlashError, runtime_failure
from pflash.flow.parts import unwrap_remote_error
from pflash.serving.validation import invalid_request_from

# Serve writes this logger to the replica's log, where a 5xx's request id finds its cause
log = logging.getLogger("ray.serve")

# ---------------------------------------------------------------------- errors


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """`{"error": {"message", "type", "param", "code"}}`: OpenAI's error envelope."""

    error: ErrorDetail


def http_error(status: int, message: str, code: str, error_type: str | None = None) -> PFlashError:
    """A failure of the edge's own that has no exception class: a body too large or too
    slow, a missing key, no such route, not ready. `error_type` defaults to OpenAI's for
    the status."""
    exc = PFlashError(message, code=code)
    exc.http_status = status
    exc.error_type = error_type or ("invalid_request_error" if status < 500 else "server_error")
    return exc


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


def error_envelope(
    exc: BaseException, request_id: str
) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, OpenAI error body, headers) of a request that failed with `exc`. A 5xx tells
    the client only what failed (the stage, the runtime condition) and the request id; the
    exception's own text, which can name actors, hosts and internals, goes to the log line
    with that id. 502/503/504 say when to retry (`Retry-After`)."""
    err = unwrap_remote_error(exc)
    status, body = error_response(err)
    headers = {}
    if status >= 500:
        message = body["error"]["message"]
        body["error"]["message"] = f"{public_message(err)} (request id {request_id})"
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


# ---------------------------------------------------------------------- SSE


@dataclass(frozen=True)
class StreamError:
    """A failure after a stream's headers were sent: the status it would have had and its
    OpenAI error body. It is the stream's last item; the API reports it in-band."""

    status: int
    body: dict[str, Any]


SSE_DONE = "data: [DONE]\n\n"
SSE_KEEPALIVE = ": keep-alive\n\n"


def sse_event(obj: BaseModel | Mapping[str, Any]) -> str:
    """One server-sent event carrying `obj` as compact JSON."""
    if isinstance(obj, BaseModel):
        payload = obj.model_dump_json()
    else:
        payload = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return f"data: {payload}\n\n"


def named_event(name: str, payload: BaseModel | Mapping[str, Any]) -> str:
    """One server-sent event with an `event:` line, as the Anthropic and Responses APIs
    frame theirs (their SDKs dispatch on it)."""
    if isinstance(payload, BaseModel):
        data = payload.model_dump_json(exclude_none=True)
    else:
        data = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return f"event: {name}\ndata: {data}\n\n"


# what an OpenAI stream carries before framing: a keep-alive comment (`SSE_KEEPALIVE`), a
# chunk, or, last, the error that ended it
StreamItem = str | BaseModel | StreamError


async def openai_frames(items: AsyncIterator[StreamItem]) -> AsyncIterator[str]:
    """Chat completions' and completions' framing: each chunk a `data:` event, an error
    in-band, then `[DONE]`."""
    async for item in items:
        if isinstance(item, str):
            yield item
        elif isinstance(item, StreamError):
            yield sse_event(item.body)
            break
        else:
            yield sse_event(item)
    yield SSE_DONE
