"""What an API served at the edge shares with the chat-completions flow.

Every endpoint runs one flow: its request becomes a `ChatCompletionRequest`, which renders
once, compresses, generates and reads tool calls exactly as `/v1/chat/completions` does.
An API other than chat completions is a translation in and out (`serving.messages`,
`serving.responses`): it parses its own body into an `Exchange`, and the exchange
turns the chat flow's answer (one `ChatCompletionResponse`, or the stream of
`ChatStreamItem`s) into that API's body or events. Errors before a response starts are
the middleware's (`serving.middleware`: the OpenAI envelope, or Anthropic's on the Messages
routes); a stream's in-band error reaches the API as `StreamError` and leaves in its shape.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pflash.serving.chat_completion.protocol import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
)
from pflash.serving.chat_completion.serving import parse_chat_request
from pflash.serving.envelope import StreamError
from pflash.serving.protocol import check_identifier

# top-level fields an edge request passes to the chat request as they are, besides every
# pflash_* field (an unknown one is a 400 there)
PASSTHROUGH = ("session_id", "seed")
# the response header that names the tools a request declared and the model was not offered
NOT_OFFERED_HEADER = "x-pflash-tools-not-offered"

# what the chat flow streams: a keep-alive comment (`SSE_KEEPALIVE`, while compressing), a
# chunk, or, last, the error that ended it
ChatStreamItem = str | ChatCompletionChunk | StreamError


@dataclass(frozen=True)
class Exchange:
    """One request of an edge API, parsed: the chat request it runs as, and the way back.
    `body` writes the API's whole response for the chat response, `events` its framed
    server-sent events for the chat flow's stream; `not_offered`: the tools the request
    declared and the model was not offered (hosted tools), which `headers` names on every
    response to it (whole or streamed)."""

    chat: ChatCompletionRequest
    body: Callable[[ChatCompletionResponse], dict[str, Any]]
    events: Callable[[AsyncIterator[ChatStreamItem]], AsyncIterator[str]]
    not_offered: tuple[str, ...] = ()

    @property
    def headers(self) -> dict[str, str]:
        return not_offered_header(self.not_offered)

    def respond(self, response: ChatCompletionResponse) -> tuple[dict[str, Any], dict[str, str]]:
        """(body, extra headers) of the API's whole response."""
        return self.body(response), pflash_header(response)

    def stream(self, items: AsyncIterator[ChatStreamItem]) -> AsyncIterator[str]:
        """The API's server-sent events, framed, for the chat flow's stream."""
        return self.events(items)


class Edge(Protocol):
    """An API served by translation. `api_key_header`: where its clients send a bare API
    key (Anthropic's `x-api-key`), or None."""

    api_key_header: str | None

    def parse(
        self, body: bytes | str | Mapping[str, Any], headers: Mapping[str, str] | None = None
    ) -> Exchange:
        """The request as an `Exchange`; `InvalidRequest` (a 400) naming the bad field.
        `headers`: the HTTP request's, where some clients name their session."""


@dataclass(frozen=True)
class Counted:
    """A token-count request of an edge API, parsed: the chat request whose prompt is counted
    (it renders exactly as the API's own request with the same conversation would)."""

    chat: ChatCompletionRequest


class Counter(Protocol):
    """A token-counting endpoint of an edge API (`/v1/messages/count_tokens`,
    `/v1/responses/input_tokens`). Agent clients call it to decide when to compact their
    context; the count is the rendered prompt before compression, the same number the API's
    usage reports for that conversation. `api_key_header` as its API's `Edge`."""

    api_key_header: str | None

    def parse(
        self, body: bytes | str | Mapping[str, Any], headers: Mapping[str, str] | None = None
    ) -> Counted:
        """The request as the chat request it would run as; `InvalidRequest` (a 400)."""

    def answer(self, input_tokens: int) -> dict[str, Any]:
        """The API's body for a count."""


def pflash_header(response: ChatCompletionResponse) -> dict[str, str]:
    """`x-pflash-stats`: `usage.timings.pflash` as compact JSON, for clients that read
    headers rather than bodies."""
    return {"x-pflash-stats": response.usage.timings.pflash.model_dump_json()}


def generation_fields(
    *,
    stream: bool,
    max_tokens: int | None,
    temperature: float | None,
    top_p: float | None,
    stop: list[str] | None = None,
) -> dict[str, Any]:
    """The chat body's generation fields of an edge request (unset ones left out). A stream
    always asks for the usage chunk: each API's last event reports usage."""
    body: dict[str, Any] = {"stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    optional = {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p}
    body |= {k: v for k, v in optional.items() if v is not None}
    if stop:
        body["stop"] = stop
    return body


def client_session(value: Any) -> str | None:
    """A session id a client sent in its own field or header (Claude Code's, Codex's
    `prompt_cache_key`), when it is one PFlash can use as `session_id` (printable ASCII, at
    most 256 characters); None otherwise: a field PFlash reads for affinity only never
    fails a request."""
    if not isinstance(value, str):
        return None
    try:
        return check_identifier(value)
    except ValueError:
        return None


def not_offered_header(names: Sequence[str]) -> dict[str, str]:
    """The response header naming the declared tools the model was not offered (hosted
    tools this server cannot run), or no header."""
    return {NOT_OFFERED_HEADER: ", ".join(names)} if names else {}


def to_chat(
    body: dict[str, Any],
    extra: dict[str, Any] | None,
    *,
    session: str | None = None,
) -> ChatCompletionRequest:
    """The chat request for a translated `body`, with the edge request's PFlash fields
    (`extra`: its unknown top-level fields) validated by the chat request's own rules;
    `session`: the client's own session id, used as `session_id` when the request names
    none."""
    for key, value in (extra or {}).items():
        if key.startswith("pflash_") or key in PASSTHROUGH:
            body[key] = value
    if session is not None and body.get("session_id") is None:
        body["session_id"] = session
    return parse_chat_request(body)
