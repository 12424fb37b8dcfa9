"""`/v1/completions` served: the request parsed, the answer written as one
`CompletionResponse` or as chunks of the same shape."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pflash.models.target.protocol import FinishReason
from pflash.serving.completion.protocol import (
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
)
from pflash.serving.protocol import ResponseMeta
from pflash.serving.usage import Usage
from pflash.serving.validation import parse_body


def parse_completion_request(body: bytes | str | Mapping[str, Any]) -> CompletionRequest:
    """Validate a `/v1/completions` body; raise `InvalidRequest` naming the bad field."""
    return parse_body(CompletionRequest, body)


def _completion_finish(reason: FinishReason | None) -> Literal["stop", "length"] | None:
    return None if reason is None else "length" if reason == "length" else "stop"


def completion_chunk(
    meta: ResponseMeta,
    text: str = "",
    *,
    finish_reason: FinishReason | None = None,
    usage: Usage | None = None,
    pflash_prompt: str | None = None,
) -> CompletionResponse:
    """A streamed completion piece; with `usage` and a finish reason, the whole response."""
    choice = CompletionChoice(text=text, finish_reason=_completion_finish(finish_reason))
    return CompletionResponse(
        **meta.fields(), choices=[choice], usage=usage, pflash_prompt=pflash_prompt
    )


def completion_response(
    meta: ResponseMeta,
    text: str,
    finish_reason: FinishReason,
    usage: Usage,
    *,
    pflash_prompt: str | None = None,
) -> CompletionResponse:
    return completion_chunk(
        meta, text, finish_reason=finish_reason, usage=usage, pflash_prompt=pflash_prompt
    )


def completion_usage_chunk(
    meta: ResponseMeta, usage: Usage, *, pflash_prompt: str | None = None
) -> CompletionResponse:
    """The `stream_options.include_usage` chunk: no choices, only usage."""
    return CompletionResponse(**meta.fields(), choices=[], usage=usage, pflash_prompt=pflash_prompt)
