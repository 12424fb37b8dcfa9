"""OpenAI Responses ↔ the chat flow: the request in, the response out (whole or streamed).
Pure functions over parsed models; errors stay in the OpenAI envelope, as the API's own.

In: `instructions` is the system message; a `message` item a message of its role (its text
parts joined by newlines); `function_call` items are tool calls of the assistant message
before them (or of a new one); a `function_call_output` a tool message. Flat function tools
become chat tools; `max_output_tokens` is `max_tokens`.

Out: a `message` item with the answer's text (left out when the answer is only calls), then
a `function_call` item per call. A cut-off answer is status "incomplete" with reason
`max_output_tokens`. Usage in the Responses API's terms (`input_tokens` the client's
original prompt, `input_tokens_details.cached_tokens` read from the target's prefix cache),
plus `usage.pflash`: `usage.timings.pflash` of the chat response.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pflash.api.edge import (
    ChatStreamItem,
    Counted,
    StreamError,
    generation_fields,
    named_event,
    parse_edge_body,
    pflash_header,
    to_chat,
)
from pflash.api.output_format import echo_text_format, text_format
from pflash.api.requests import ChatCompletionRequest
from pflash.api.responses import ChatCompletionChunk, ChatCompletionResponse, Usage
from pflash.api.responses_api.protocol import (
    NAMES,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionChoice,
    InputTokensRequest,
    ResponsesRequest,
    TextPart,
)

# ---------------------------------------------------------------------- request in


def parse_responses_request(body: bytes | str | Mapping[str, Any]) -> ResponsesRequest:
    """Validate a request body; raise `InvalidRequest` naming the bad field."""
    return parse_edge_body(ResponsesRequest, body, NAMES)


def _joined(parts: list[TextPart]) -> str:
    return "\n".join(p.text for p in parts)


def chat_messages(req: InputTokensRequest) -> list[dict[str, Any]]:
    """The input as chat-completions messages (OpenAI chat format)."""
    out: list[dict[str, Any]] = []
    if req.instructions is not None:
        out.append({"role": "system", "content": req.instructions})
    for item in req.input:
        if isinstance(item, FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
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


def _conversation(req: InputTokensRequest) -> dict[str, Any]:
    """The chat body of what renders the prompt: messages, tools and the tool choice (the
    chat template reads the tools)."""
    body: dict[str, Any] = {"messages": chat_messages(req)}
    if req.model is not None:
        body["model"] = req.model
    if req.tools:
        body["tools"] = [
            {"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
            for t in req.tools
        ]
    if isinstance(req.tool_choice, FunctionChoice):
        body["tool_choice"] = {"type": "function", "function": {"name": req.tool_choice.name}}
    elif req.tool_choice is not None:
        body["tool_choice"] = req.tool_choice
    return body


def chat_request(req: ResponsesRequest) -> ChatCompletionRequest:
    """The one internal request the chat flow serves for `req`."""
    generation = generation_fields(
        stream=req.stream,
        max_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
    )
    body = _conversation(req) | generation
    if (wanted := text_format(req.text)) is not None:
        body["response_format"] = wanted.response_format()
    return to_chat(body, req.model_extra, format_param="text.format")


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


def call_item(call: dict[str, Any], status: str, arguments: str | None = None) -> dict[str, Any]:
    """A chat tool call as a `function_call` item (`call_id` is the chat call's id)."""
    function = call["function"]
    return {
        "type": "function_call",
        "id": "fc_" + call["id"].split("_", 1)[-1],
        "call_id": call["id"],
        "name": function["name"],
        "arguments": function["arguments"] if arguments is None else arguments,
        "status": status,
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
        if isinstance(choice, FunctionChoice)
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
    output += [call_item(call, "completed") for call in calls]
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
        item = call_item(call, "completed")
        self.output.append(item)
        added = call_item(call, "in_progress", arguments="")
        return [
            self.event("response.output_item.added", output_index=index, item=added),
            self.event(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=index,
                delta=item["arguments"],
            ),
            self.event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                name=item["name"],
                arguments=item["arguments"],
            ),
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
    state = ResponseEvents(source)
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


@dataclass(frozen=True)
class ResponsesExchange:
    """One `/v1/responses` request: the Responses request and the chat request it runs as."""

    source: ResponsesRequest
    chat: ChatCompletionRequest

    def respond(self, response: ChatCompletionResponse) -> tuple[dict[str, Any], dict[str, str]]:
        return response_body(self.source, response), pflash_header(response)

    def stream(self, items: AsyncIterator[ChatStreamItem]) -> AsyncIterator[str]:
        return response_events(self.source, items)


@dataclass(frozen=True)
class ResponsesEdge:
    """`/v1/responses` at the edge; errors keep the OpenAI envelope, the API's own."""

    id_header: str | None = None

    def parse(self, body: bytes | str | Mapping[str, Any]) -> ResponsesExchange:
        source = parse_responses_request(body)
        return ResponsesExchange(source, chat_request(source))

    def error(self, status: int, body: dict[str, Any]) -> dict[str, Any]:
        return body


EDGE = ResponsesEdge()


@dataclass(frozen=True)
class ResponsesCounter:
    """`/v1/responses/input_tokens`: `{"object": "response.input_tokens", "input_tokens": n}`,
    n the prompt a Responses request with this input renders to, before compression (its
    usage's `input_tokens`). Errors in the OpenAI envelope, as `/v1/responses`."""

    edge: ResponsesEdge = EDGE

    def parse(self, body: bytes | str | Mapping[str, Any]) -> Counted:
        return Counted(count_request(parse_edge_body(InputTokensRequest, body, NAMES)))

    def answer(self, input_tokens: int) -> dict[str, Any]:
        return {"object": "response.input_tokens", "input_tokens": input_tokens}


COUNT = ResponsesCounter()
