"""`/v1/chat/completions` served: the request parsed, the answer written as one
`ChatCompletionResponse` or as `ChatCompletionChunk`s (`ChatAnswer`), its hermes-format
tool calls read as `tool_calls` (`serving.tool_calls`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pflash.models.target.protocol import FinishReason, GenerationDone
from pflash.serving.answer import Call
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
from pflash.serving.tool_calls import ToolCallStream, split_tool_calls, tool_finish, with_index
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


class ChatAnswer:
    """The chat completion of one call (`answer.Answer`). The answer's text is read for
    calls to the functions the request may call (none when `tool_call_parser` is "none");
    while streaming, text from a possible `<tool_call>` on is held back until the answer
    ends, so a call never reaches the client as content."""

    kind = "chat"
    id_prefix = "chatcmpl-"
    parse = staticmethod(parse_chat_request)

    def __init__(self, call: Call, prompt: str | None) -> None:
        self.meta, self.prompt = call.meta, prompt
        request: ChatCompletionRequest = call.request
        parser_on = call.config.tool_call_parser != "none"
        self.tools = request.callable_tools() if parser_on else frozenset()
        self.held = ToolCallStream(self.tools)

    def whole(self, text: str, done: GenerationDone, usage: Usage) -> ChatCompletionResponse:
        content, calls = split_tool_calls(text, self.tools)
        return chat_response(
            self.meta,
            content,
            tool_finish(done.finish_reason, calls),
            usage,
            tool_calls=calls,
            pflash_prompt=self.prompt,
        )

    def opening(self) -> list[ChatCompletionChunk]:
        return [chat_chunk(self.meta, role="assistant", content="", pflash_prompt=self.prompt)]

    def piece(self, text: str) -> list[ChatCompletionChunk]:
        sendable = self.held.feed(text)
        return [chat_chunk(self.meta, content=sendable)] if sendable else []

    def closing(self, done: GenerationDone) -> list[ChatCompletionChunk]:
        rest, calls = self.held.finish()
        chunks = []
        if rest or calls:
            chunks.append(chat_chunk(self.meta, content=rest or None, tool_calls=with_index(calls)))
        finish = tool_finish(done.finish_reason, calls)
        return [*chunks, chat_chunk(self.meta, finish_reason=finish)]

    def usage(self, usage: Usage) -> ChatCompletionChunk:
        return chat_usage_chunk(self.meta, usage)
