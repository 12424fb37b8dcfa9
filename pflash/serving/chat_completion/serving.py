"""`/v1/chat/completions` served: the request parsed, the answer written as one
`ChatCompletionResponse` or as `ChatCompletionChunk`s."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pflash.models.target.protocol import FinishReason
from pflash.serving.chat_completion.protocol import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatResponseMessage,
)
from pflash.serving.protocol import ResponseMeta
from pflash.serving.usage import Usage
from pflash.serving.validation import parse_body


def parse_chat_request(body: bytes | str | Mapping[str, Any]) -> ChatCompletionRequest:
    """Validate a `/v1/chat/completions` body; raise `InvalidRequest` naming the bad field."""
    return parse_body(ChatCompletionRequest, body)


def chat_response(
    meta: ResponseMeta,
    text: str,
    finish_reason: FinishReason,
    usage: Usage,
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    pflash_prompt: str | None = None,
) -> ChatCompletionResponse:
    content = text if text or not tool_calls else None
    message = ChatResponseMessage(content=content, tool_calls=tool_calls or None)
    choice = ChatChoice(message=message, finish_reason=finish_reason)
    return ChatCompletionResponse(
        **meta.fields(), choices=[choice], usage=usage, pflash_prompt=pflash_prompt
    )


def chat_chunk(
    meta: ResponseMeta,
    *,
    role: Literal["assistant"] | None = None,
    content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    finish_reason: FinishReason | None = None,
    pflash_prompt: str | None = None,
) -> ChatCompletionChunk:
    """One streamed chat delta. The first carries `role="assistant"`, the last `finish_reason`."""
    delta = ChatDelta(role=role, content=content, tool_calls=tool_calls or None)
    choice = ChatChunkChoice(delta=delta, finish_reason=finish_reason)
    return ChatCompletionChunk(**meta.fields(), choices=[choice], pflash_prompt=pflash_prompt)


def chat_usage_chunk(
    meta: ResponseMeta, usage: Usage, *, pflash_prompt: str | None = None
) -> ChatCompletionChunk:
    """The `stream_options.include_usage` chunk: no choices, only usage."""
    return ChatCompletionChunk(
        **meta.fields(), choices=[], usage=usage, pflash_prompt=pflash_prompt
    )
