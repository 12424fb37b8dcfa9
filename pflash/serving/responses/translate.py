"""OpenAI Responses ↔ the chat flow: the request in, the response out (whole or streamed).
Pure functions over parsed models; errors stay in the OpenAI envelope, as the API's own.

In: `instructions` is the system message; a `message` item a message of its role (its text
parts joined by newlines); `function_call` and `custom_tool_call` items are tool calls of
the assistant message before them (or of a new one); their outputs are tool messages;
`reasoning` items are dropped. Tools become chat functions (`tools.ToolTable`): a function
as it is, a namespace's functions under `<namespace>__<name>`, a custom tool as a function
of one string `input` (its grammar in its description); hosted tools are not offered.
`max_output_tokens` is `max_tokens`; `prompt_cache_key` (else Codex's `session-id` header)
names the client's session.

Out: a `message` item with the answer's text (left out when the answer is only calls), then
per call a `function_call` item (with its `namespace` for a namespaced function: the names
the client declared) or a `custom_tool_call` item with the `input` text. A cut-off answer is
status "incomplete" with reason `max_output_tokens`. Usage in the Responses API's terms (`input_tokens` the client's
original prompt, `input_tokens_details.cached_tokens` read from the target's prefix cache),
plus `usage.pflash`: `usage.timings.pflash` of the chat response.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from functools import partial
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
from pflash.serving.output_format import echo_text_format, text_format
from pflash.serving.responses.protocol import (
    NAMES,
    AllowedToolsChoice,
    CustomToolCallItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionChoice,
    InputTokensRequest,
    ReasoningItem,
    ResponsesRequest,
    TextPart,
)
from pflash.serving.responses.tools import ToolTable, call_item, chat_name, tool_table
from pflash.serving.usage import Usage
from pflash.serving.validation import parse_body

# Codex names its session in this header too (and in `prompt_cache_key`)
SESSION_HEADER = "session-id"
FILE_LEFT_OUT = "[{kind} left out: this server reads text only]"


# ---------------------------------------------------------------------- request in


def parse_responses_request(body: bytes | str | Mapping[str, Any]) -> ResponsesRequest:
    """Validate a request body; raise `InvalidRequest` naming the bad field."""
    return parse_body(ResponsesRequest, body, NAMES)


def _joined(parts: list) -> str:
    """Text parts joined by newlines; an image or file a tool returned is a note."""
    return "\n".join(
        p.text if isinstance(p, TextPart) else FILE_LEFT_OUT.format(kind=p.type[len("input_") :])
        for p in parts
    )


def chat_messages(req: InputTokensRequest) -> list[dict[str, Any]]:
    """The input as chat-completions messages (OpenAI chat format)."""
    out: list[dict[str, Any]] = []
    if req.instructions is not None:
        out.append({"role": "system", "content": req.instructions})
    for item in req.input:
        if isinstance(item, ReasoningItem):
            continue
        if isinstance(item, FunctionCallItem | CustomToolCallItem):
            if isinstance(item, FunctionCallItem):
                name, arguments = chat_name(item.name, item.namespace), item.arguments
            else:
                name, arguments = item.name, json.dumps({"input": item.input}, ensure_ascii=False)
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            out.append(
                {"role": "tool", "tool_call_id": item.call_id, "content": _joined(item.output)}
            )
        else:
            out.append({"role": item.role, "content": _joined(item.content)})
    return out


def _tool_choice(req: InputTokensRequest, table: ToolTable) -> Any:
    """The chat `tool_choice`: a named function or custom tool as the chat function it is
    offered as; `allowed_tools` as its mode (the tools it lists are offered already)."""
    choice = req.tool_choice
    if isinstance(choice, FunctionChoice):
        wanted = [n for n, ref in table.refs.items() if ref.name == choice.name or n == choice.name]
        if len(wanted) != 1:
            raise InvalidRequest(
                f"tool_choice: {choice.name!r} names no single declared tool",
                param="tool_choice",
                code="invalid_value",
            )
        return {"type": "function", "function": {"name": wanted[0]}}
    if isinstance(choice, AllowedToolsChoice):
        return choice.mode
    return choice


def _conversation(req: InputTokensRequest) -> dict[str, Any]:
    """The chat body of what renders the prompt: messages, tools and the tool choice (the
    chat template reads the tools)."""
    body: dict[str, Any] = {"messages": chat_messages(req)}
    if req.model is not None:
        body["model"] = req.model
    table = tool_table(req)
    if table.functions:
        body["tools"] = [{"type": "function", "function": f} for f in table.functions]
    choice = _tool_choice(req, table)
    if choice is not None:
        body["tool_choice"] = choice
    return body


def session_of(req: InputTokensRequest, headers: Mapping[str, str] | None = None) -> str | None:
    """The client's own session id: `prompt_cache_key` (Codex sends its session id there),
    else Codex's `session-id` header; None when neither names a usable one."""
    found = client_session(req.prompt_cache_key)
    if found is None and headers is not None:
        found = client_session(headers.get(SESSION_HEADER))
    return found


def chat_request(
    req: ResponsesRequest, headers: Mapping[str, str] | None = None
) -> ChatCompletionRequest:
    """The one internal request the chat flow serves for `req` (`headers`: the request's,
    where Codex also names its session)."""
    generation = generation_fields(
        stream=req.stream,
        max_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
    )
    body = _conversation(req) | generation
    if (wanted := text_format(req.text)) is not None:
        body["response_format"] = wanted.response_format()
    return to_chat(body, req.model_extra, session=session_of(req, headers))


def count_request(req: InputTokensRequest) -> ChatCompletionRequest:
    """The chat request whose prompt `input_tokens` counts: the same render as a Responses
    request with this conversation, whatever it would ask to generate."""
    return to_chat(_conversation(req), req.model_extra)


# ---------------------------------------------------------------------- response out


def usage(u: Usage) -> dict[str, Any]:
    return {
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": u.prompt_tokens_details.cached_tokens,
            "cache_write_tokens": 0,
        },
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.total_tokens,
        "pflash": u.timings.pflash.model_dump(mode="json"),
    }


def _hex(chat_id: str) -> str:
    return chat_id.split("-", 1)[-1]


def message_item(chat_id: str, text: str, status: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {
        "type": "message",
        "id": "msg_" + _hex(chat_id),
        "status": status,
        "role": "assistant",
        "content": [part] if status == "completed" else [],
    }


def response_object(
    source: ResponsesRequest,
    chunk: ChatCompletionResponse | ChatCompletionChunk,
    *,
    status: str,
    output: list[dict[str, Any]],
    usage_body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The `response` object: the answer so far and the request's settings echoed."""
    choice = source.tool_choice
    body: dict[str, Any] = {
        "id": "resp_" + _hex(chunk.id),
        "object": "response",
        "created_at": chunk.created,
        "status": status,
        "error": None,
        "incomplete_details": ({"reason": "max_output_tokens"} if status == "incomplete" else None),
        "instructions": source.instructions,
        "max_output_tokens": source.max_output_tokens,
        "model": chunk.model,
        "output": output,
        "parallel_tool_calls": (
            True if source.parallel_tool_calls is None else source.parallel_tool_calls
        ),
        "previous_response_id": None,
        "store": False,
        "temperature": 1.0 if source.temperature is None else source.temperature,
        "top_p": 1.0 if source.top_p is None else source.top_p,
        "tool_choice": choice.model_dump()
        if isinstance(choice, FunctionChoice | AllowedToolsChoice)
        else choice or "auto",
        "tools": [t.model_dump(exclude_none=True) for t in source.tools or ()],
        "text": echo_text_format(source.text),
        "truncation": "disabled",
        "metadata": source.metadata or {},
        "usage": usage_body,
    }
    if chunk.pflash_prompt is not None:
        body["pflash_prompt"] = chunk.pflash_prompt
    return body


def _status(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def response_body(source: ResponsesRequest, resp: ChatCompletionResponse) -> dict[str, Any]:
    """The whole response for a chat completion."""
    choice = resp.choices[0]
    calls = choice.message.tool_calls or []
    output = []
    if choice.message.content or not calls:
        output.append(message_item(resp.id, choice.message.content or "", "completed"))
    table = tool_table(source)
    output += [call_item(call, "completed", table) for call in calls]
    return response_object(
        source,
        resp,
        status=_status(choice.finish_reason),
        output=output,
        usage_body=usage(resp.usage),
    )


# ---------------------------------------------------------------------- stream out


@dataclass
class ResponseEvents:
    """The typed events of one streamed response, numbered by `sequence_number`.

    Order: `response.created`, `response.in_progress`; for the text, `output_item.added`,
    `content_part.added`, `output_text.delta`s, `output_text.done`, `content_part.done`,
    `output_item.done`; per call, `output_item.added`, `function_call_arguments.delta` (the
    whole arguments: calls are read once complete) and `.done`, `output_item.done`; last
    `response.completed` (or `response.incomplete` when cut off) with usage."""

    source: ResponsesRequest
    table: ToolTable = field(default_factory=ToolTable)
    sequence: int = 0
    output: list[dict[str, Any]] = field(default_factory=list)
    text: list[str] | None = None  # the open message item's text, None when none is open
    finish_reason: str | None = None

    def event(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return named_event(kind, payload)

    def start(self, chunk: ChatCompletionChunk) -> list[str]:
        created = response_object(self.source, chunk, status="in_progress", output=[])
        return [
            self.event("response.created", response=created),
            self.event("response.in_progress", response=created),
        ]

    def text_delta(self, chunk: ChatCompletionChunk, delta: str) -> list[str]:
        events = []
        index = len(self.output)
        item_id = "msg_" + _hex(chunk.id)
        if self.text is None:
            self.text = []
            item = message_item(chunk.id, "", "in_progress")
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            events += [
                self.event("response.output_item.added", output_index=index, item=item),
                self.event(
                    "response.content_part.added",
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    part=part,
                ),
            ]
        self.text.append(delta)
        events.append(
            self.event(
                "response.output_text.delta",
                item_id=item_id,
                output_index=index,
                content_index=0,
                delta=delta,
                logprobs=[],
            )
        )
        return events

    def close_text(self, chunk: ChatCompletionChunk) -> list[str]:
        if self.text is None:
            return []
        item = message_item(chunk.id, "".join(self.text), "completed")
        self.text = None
        index = len(self.output)
        self.output.append(item)
        part = item["content"][0]
        return [
            self.event(
                "response.output_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=part["text"],
                logprobs=[],
            ),
            self.event(
                "response.content_part.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part=part,
            ),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def call(self, call: dict[str, Any]) -> list[str]:
        index = len(self.output)
        item = call_item(call, "completed", self.table)
        self.output.append(item)
        added = call_item(call, "in_progress", self.table, arguments="")
        if item["type"] == "custom_tool_call":
            kind, text, done = (
                "response.custom_tool_call_input",
                item["input"],
                {"input": item["input"]},
            )
        else:
            kind, text = "response.function_call_arguments", item["arguments"]
            done = {"name": item["name"], "arguments": item["arguments"]}
        return [
            self.event("response.output_item.added", output_index=index, item=added),
            self.event(f"{kind}.delta", item_id=item["id"], output_index=index, delta=text),
            self.event(f"{kind}.done", item_id=item["id"], output_index=index, **done),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def finish(self, chunk: ChatCompletionChunk, u: Usage) -> list[str]:
        events = []
        if not self.output and self.text is None:  # an empty answer is still a message
            events += self.text_delta(chunk, "")
        events += self.close_text(chunk)
        status = _status(self.finish_reason)
        body = response_object(
            self.source, chunk, status=status, output=self.output, usage_body=usage(u)
        )
        name = "response.completed" if status == "completed" else "response.incomplete"
        return [*events, self.event(name, response=body)]

    def error(self, failure: StreamError) -> str:
        detail = failure.body["error"]
        return self.event(
            "error", code=detail.get("code"), message=detail["message"], param=detail.get("param")
        )


async def response_events(
    source: ResponsesRequest, items: AsyncIterator[ChatStreamItem]
) -> AsyncIterator[str]:
    """The Responses API's events for the chat flow's stream (`ResponseEvents` says which);
    keep-alive comments pass through; a failure ends the stream with an `error` event."""
    state = ResponseEvents(source, tool_table(source))
    started = False
    async for item in items:
        if isinstance(item, str):
            yield item
            continue
        if isinstance(item, StreamError):
            yield state.error(item)
            return
        events: list[str] = []
        if not started:
            started = True
            events += state.start(item)
        for choice in item.choices:
            if choice.delta.content:
                events += state.text_delta(item, choice.delta.content)
            if choice.delta.tool_calls:
                events += state.close_text(item)
                for call in choice.delta.tool_calls:
                    events += state.call(call)
            if choice.finish_reason is not None:
                state.finish_reason = choice.finish_reason
        if item.usage is not None:
            events += state.finish(item, item.usage)
        for event in events:
            yield event
        if item.usage is not None:
            return


# ---------------------------------------------------------------------- the edge


class ResponsesEdge:
    """`/v1/responses` at the edge; errors keep the OpenAI envelope, the API's own."""

    api_key_header = None

    def parse(
        self, body: bytes | str | Mapping[str, Any], headers: Mapping[str, str] | None = None
    ) -> Exchange:
        source = parse_responses_request(body)
        return Exchange(
            chat_request(source, headers),
            partial(response_body, source),
            partial(response_events, source),
            tool_table(source).not_offered,
        )


EDGE = ResponsesEdge()


class ResponsesCounter:
    """`/v1/responses/input_tokens`: `{"object": "response.input_tokens", "input_tokens": n}`,
    n the prompt a Responses request with this input renders to, before compression (its
    usage's `input_tokens`). Errors in the OpenAI envelope, as `/v1/responses`."""

    api_key_header = None

    def parse(
        self, body: bytes | str | Mapping[str, Any], headers: Mapping[str, str] | None = None
    ) -> Counted:
        return Counted(count_request(parse_body(InputTokensRequest, body, NAMES)))

    def answer(self, input_tokens: int) -> dict[str, Any]:
        return {"object": "response.input_tokens", "input_tokens": input_tokens}


COUNT = ResponsesCounter()
