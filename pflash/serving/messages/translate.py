"""Anthropic Messages ↔ the chat flow: the request in, the message out (whole or streamed),
errors in Anthropic's shape. Pure functions over parsed models.

In: `system` is the system message, and a `system` message inside `messages` a system
message at its place; a user message's text blocks are its content and each `tool_result` a
tool message (in block order); an assistant message's text blocks are its content and each
`tool_use` a tool call whose arguments are its `input` as JSON (its `thinking` blocks are
dropped). A tool result's image, or a document that is not plain text, is a note saying it
was left out. Client `tools` become functions (`input_schema` their parameters); server
tools are not offered (`Offered`); `tool_choice` auto/any/tool/none maps to
auto/required/the named function/none; `stop_sequences` to `stop`. The client's session
(`session_id`, else `metadata.user_id`'s session, else Claude Code's session header) names
the conversation for affinity.

Out: text then `tool_use` blocks (a call's arguments parsed back into `input`); the finish
reason as `stop_reason` (stop → end_turn, length → max_tokens, tool_calls → tool_use: the
targets do not say whether a stop sequence or the end of turn stopped them, so
`stop_sequence` is never reported). Usage in Anthropic's terms: `input_tokens` are the
client's prompt tokens not read from the target's prefix cache, `cache_read_input_tokens`
those that were (their sum is the original prompt, before compression), and
`usage.pflash` carries `usage.timings.pflash` of the chat response.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from pflash.errors import InvalidRequest
from pflash.serving.chat_completion.protocol import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
)
from pflash.serving.edge import (
    ChatStreamItem,
    Counted,
    Exchange,
    client_session,
    generation_fields,
    to_chat,
)
from pflash.serving.envelope import StreamError, named_event
from pflash.serving.messages.protocol import (
    NAMES,
    CountTokensRequest,
    DocumentBlock,
    ImageBlock,
    InputMessage,
    MessagesRequest,
    ServerTool,
    TextBlock,
    ThinkingBlock,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
)
from pflash.serving.output_format import messages_format
from pflash.serving.usage import Usage
from pflash.serving.validation import parse_body

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
# what a tool result's unreadable parts become: the model learns something was there
IMAGE_LEFT_OUT = "[image left out: this server reads text only]"
DOCUMENT_LEFT_OUT = "[document left out: this server reads plain-text documents only]"
# Anthropic clients send their API key bare in this header (the tenant check reads it)
API_KEY_HEADER = "x-api-key"
# Claude Code names its session in this header too (and inside metadata.user_id)
SESSION_HEADER = "x-claude-code-session-id"
MAX_USER_ID_CHARS = 1024  # metadata.user_id is parsed for a session id only this long

# our statuses -> Anthropic's error types (https://docs.anthropic.com/en/api/errors)
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


# ---------------------------------------------------------------------- request in


def parse_messages_request(body: bytes | str | Mapping[str, Any]) -> MessagesRequest:
    """Validate a request body; raise `InvalidRequest` naming the bad field."""
    return parse_body(MessagesRequest, body, NAMES)


def _joined(blocks: list[TextBlock]) -> str:
    return "\n".join(b.text for b in blocks)


def _misplaced(i: int, j: int, what: str, where: str) -> InvalidRequest:
    return InvalidRequest(
        f"messages[{i}].content[{j}]: {what} belongs in {where}",
        param=f"messages[{i}].content[{j}]",
        code="invalid_value",
    )


def _unreadable(i: int, j: int) -> InvalidRequest:
    return InvalidRequest(
        f"messages[{i}].content[{j}]: this server reads text only (a document needs a "
        "plain-text source)",
        param=f"messages[{i}].content[{j}]",
        code="invalid_value",
    )


def _result_text(block: ToolResultBlock) -> str:
    """A tool result's content as text: its text blocks, a plain-text document's text, and
    a note in place of what cannot be read."""
    parts = []
    for part in block.content:
        if isinstance(part, TextBlock):
            parts.append(part.text)
        elif isinstance(part, ImageBlock):
            parts.append(IMAGE_LEFT_OUT)
        else:
            text = part.text()
            parts.append(DOCUMENT_LEFT_OUT if text is None else text)
    return "\n".join(parts)


def _assistant_message(i: int, message: InputMessage) -> dict[str, Any]:
    texts: list[TextBlock] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(message.content):
        if isinstance(block, ThinkingBlock):
            continue
        if isinstance(block, TextBlock):
            texts.append(block)
        elif isinstance(block, ToolUseBlock):
            arguments = json.dumps(block.input, ensure_ascii=False)
            calls.append(
                {
                    "id": block.id,
                    "type": "function",
                    "function": {"name": block.name, "arguments": arguments},
                }
            )
        elif isinstance(block, ToolResultBlock):
            raise _misplaced(i, j, "a tool_result block", "a user message")
        else:
            raise _misplaced(i, j, "a document block", "a user message")
    out: dict[str, Any] = {"role": "assistant", "content": _joined(texts) if texts else None}
    if calls:
        out["tool_calls"] = calls
    elif not texts:
        out["content"] = ""
    return out


def _user_messages(i: int, message: InputMessage) -> list[dict[str, Any]]:
    """A user message's tool results as tool messages and its text as one user message,
    in block order."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, block in enumerate(message.content):
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, DocumentBlock):
            text = block.text()
            if text is None:
                raise _unreadable(i, j)
            texts.append(text)
        elif isinstance(block, ToolResultBlock):
            if texts:
                out.append({"role": "user", "content": "\n".join(texts)})
                texts = []
            out.append(
                {"role": "tool", "tool_call_id": block.tool_use_id, "content": _result_text(block)}
            )
        elif isinstance(block, ToolUseBlock):
            raise _misplaced(i, j, "a tool_use block", "an assistant message")
        else:
            raise _misplaced(i, j, f"a {block.type} block", "an assistant message")
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _system_message(i: int, message: InputMessage) -> dict[str, Any]:
    """A mid-conversation system turn (Claude Code announces them in its betas): a system
    message at its place, which a chat template renders where it stands."""
    for j, block in enumerate(message.content):
        if not isinstance(block, TextBlock):
            raise _misplaced(i, j, f"a {block.type} block", "a user or assistant message")
    return {"role": "system", "content": _joined(message.content)}  # type: ignore[arg-type]


def chat_messages(req: CountTokensRequest) -> list[dict[str, Any]]:
    """The conversation as chat-completions messages (OpenAI format)."""
    out: list[dict[str, Any]] = []
    if req.system:
        out.append({"role": "system", "content": _joined(req.system)})
    for i, message in enumerate(req.messages):
        if message.role == "assistant":
            out.append(_assistant_message(i, message))
        elif message.role == "system":
            out.append(_system_message(i, message))
        else:
            out.extend(_user_messages(i, message))
    return out


def offered_tools(req: CountTokensRequest) -> tuple[list[ToolDefinition], list[str]]:
    """(the client tools offered to the model, the names of the server tools that are not:
    Anthropic runs those on its own servers, and they have no schema to show a model)."""
    tools = req.tools or []
    offered = [t for t in tools if isinstance(t, ToolDefinition)]
    return offered, [t.name for t in tools if isinstance(t, ServerTool)]


def session_of(req: MessagesRequest, headers: Mapping[str, str] | None = None) -> str | None:
    """The client's own session id: `metadata.user_id`'s session (Claude Code writes a JSON
    object with `session_id` there, older versions `..._session_<uuid>`), else Claude Code's
    session header. None when neither names one."""
    user_id = (req.metadata or {}).get("user_id")
    found = None
    if isinstance(user_id, str) and len(user_id) <= MAX_USER_ID_CHARS:
        if user_id.startswith("{"):
            try:
                value = json.loads(user_id)
            except ValueError:
                value = None
            if isinstance(value, dict) and isinstance(value.get("session_id"), str):
                found = value["session_id"]
        elif "_session_" in user_id:
            found = user_id.rsplit("_session_", 1)[1]
    if not found and headers is not None:
        found = headers.get(SESSION_HEADER)
    return client_session(found)


def _tool_choice(req: CountTokensRequest) -> Any:
    choice = req.tool_choice
    if choice is None:
        return None
    if choice.type == "tool":
        if not choice.name:
            raise InvalidRequest(
                "tool_choice: a choice of type 'tool' needs the tool's name",
                param="tool_choice.name",
                code="missing_required_parameter",
            )
        return {"type": "function", "function": {"name": choice.name}}
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]


def _conversation(req: CountTokensRequest) -> dict[str, Any]:
    """The chat body of what renders the prompt: model, messages, tools and the tool choice
    (the chat template reads the tools)."""
    body: dict[str, Any] = {"model": req.model, "messages": chat_messages(req)}
    offered, _ = offered_tools(req)
    if offered:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    **({"description": t.description} if t.description is not None else {}),
                    "parameters": t.input_schema,
                },
            }
            for t in offered
        ]
    choice = _tool_choice(req)
    if choice is not None:
        body["tool_choice"] = choice
    return body


def chat_request(
    req: MessagesRequest, headers: Mapping[str, str] | None = None
) -> ChatCompletionRequest:
    """The one internal request the chat flow serves for `req` (`headers`: the request's,
    where Claude Code also names its session)."""
    generation = generation_fields(
        stream=req.stream,
        max_tokens=req.max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        stop=req.stop_sequences,
    )
    body = _conversation(req) | generation
    beta = req.output_format is not None
    fmt = req.output_format if beta else req.output_config and req.output_config.format
    if (wanted := messages_format(fmt)) is not None:
        body["response_format"] = wanted.response_format()
    return to_chat(
        body,
        req.model_extra,
        session=session_of(req, headers),
    )


def count_request(req: CountTokensRequest) -> ChatCompletionRequest:
    """The chat request whose prompt `count_tokens` counts: the same render as a Messages
    request with this conversation, whatever it would ask to generate."""
    return to_chat(_conversation(req), req.model_extra)


# ---------------------------------------------------------------------- response out


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as `tool_use.input`. Arguments that are not a JSON object (a model
    can write a bare string) are kept whole under "arguments" rather than dropped."""
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"arguments": arguments}


def usage(u: Usage) -> dict[str, Any]:
    cached = u.prompt_tokens_details.cached_tokens
    return {
        "input_tokens": max(0, u.prompt_tokens - cached),
        "output_tokens": u.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "pflash": u.timings.pflash.model_dump(mode="json"),
    }


def message_id(chat_id: str) -> str:
    """`msg_<hex>` for the chat response `chatcmpl-<hex>`: one id, both spellings."""
    return "msg_" + chat_id.split("-", 1)[-1]


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    function = call["function"]
    return {
        "type": "tool_use",
        "id": call["id"],
        "name": function["name"],
        "input": tool_input(function["arguments"]),
    }


def message_body(resp: ChatCompletionResponse) -> dict[str, Any]:
    """The Anthropic message for a whole chat completion."""
    choice = resp.choices[0]
    content: list[dict[str, Any]] = []
    if choice.message.content:
        content.append({"type": "text", "text": choice.message.content})
    content += [_tool_use(call) for call in choice.message.tool_calls or ()]
    body: dict[str, Any] = {
        "id": message_id(resp.id),
        "type": "message",
        "role": "assistant",
        "model": resp.model,
        "content": content,
        "stop_reason": STOP_REASONS[choice.finish_reason],
        "stop_sequence": None,
        "usage": usage(resp.usage),
    }
    if resp.pflash_prompt is not None:
        body["pflash_prompt"] = resp.pflash_prompt
    return body


def error_body(status: int, body: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI error body of a `status` response as Anthropic's
    `{"type": "error", "error": {"type", "message"}}`."""
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": body["error"]["message"]}}


# ---------------------------------------------------------------------- stream out


def _event(name: str, **fields: Any) -> str:
    return named_event(name, {"type": name, **fields})


def _message_start(chunk: ChatCompletionChunk) -> str:
    message: dict[str, Any] = {
        "id": message_id(chunk.id),
        "type": "message",
        "role": "assistant",
        "model": chunk.model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }
    if chunk.pflash_prompt is not None:
        message["pflash_prompt"] = chunk.pflash_prompt
    return _event("message_start", message=message)


async def message_events(items: AsyncIterator[ChatStreamItem]) -> AsyncIterator[str]:
    """The documented event sequence for the chat flow's stream: `message_start`, `ping`,
    per block `content_block_start` / `_delta` (text_delta, or one input_json_delta with a
    call's whole input: calls are read once complete) / `_stop`, then `message_delta` with
    `stop_reason` and usage, and `message_stop`. Keep-alive comments pass through; a failure
    ends the stream with an `error` event."""
    started = False
    text_block: int | None = None  # index of the open text block
    blocks = 0
    stop_reason = "end_turn"
    async for item in items:
        if isinstance(item, str):
            yield item
            continue
        if isinstance(item, StreamError):
            yield named_event("error", error_body(item.status, item.body))
            return
        if not started:
            started = True
            yield _message_start(item)
            yield _event("ping")
        for choice in item.choices:
            delta = choice.delta
            if delta.content:
                if text_block is None:
                    text_block, blocks = blocks, blocks + 1
                    yield _event(
                        "content_block_start",
                        index=text_block,
                        content_block={"type": "text", "text": ""},
                    )
                yield _event(
                    "content_block_delta",
                    index=text_block,
                    delta={"type": "text_delta", "text": delta.content},
                )
            for call in delta.tool_calls or ():
                if text_block is not None:
                    yield _event("content_block_stop", index=text_block)
                    text_block = None
                block = _tool_use(call)
                partial = json.dumps(block["input"], ensure_ascii=False)
                yield _event(
                    "content_block_start", index=blocks, content_block={**block, "input": {}}
                )
                yield _event(
                    "content_block_delta",
                    index=blocks,
                    delta={"type": "input_json_delta", "partial_json": partial},
                )
                yield _event("content_block_stop", index=blocks)
                blocks += 1
            if choice.finish_reason is not None:
                stop_reason = STOP_REASONS[choice.finish_reason]
        if item.usage is not None:
            if text_block is not None:
                yield _event("content_block_stop", index=text_block)
            yield _event(
                "message_delta",
                delta={"stop_reason": stop_reason, "stop_sequence": None},
                usage=usage(item.usage),
            )
            yield _event("message_stop")
            return


# ---------------------------------------------------------------------- the edge


class MessagesEdge:
    """`/v1/messages` at the edge."""

    api_key_header = API_KEY_HEADER

    def parse(
        self, body: bytes | str | Mapping[str, Any], headers: Mapping[str, str] | None = None
    ) -> Exchange:
        source = parse_messages_request(body)
        _, not_offered = offered_tools(source)
        chat = chat_request(source, headers)
        return Exchange(chat, message_body, message_events, tuple(not_offered))


EDGE = MessagesEdge()


class MessagesCounter:
    """`/v1/messages/count_tokens`: `{"input_tokens": n}`, n the prompt a Messages request
    with this conversation renders to, before compression (`input_tokens` +
    `cache_read_input_tokens` of its usage). Claude Code and other Anthropic clients call it
    to manage their context; errors and the request id as `/v1/messages`."""

    api_key_header = API_KEY_HEADER

    def parse(
        self, body: bytes | str | Mapping[str, Any], headers: Mapping[str, str] | None = None
    ) -> Counted:
        return Counted(count_request(parse_body(CountTokensRequest, body, NAMES)))

    def answer(self, input_tokens: int) -> dict[str, Any]:
        return {"input_tokens": input_tokens}


COUNT = MessagesCounter()
