"""The Anthropic Messages API (`POST /v1/messages`) as a translation onto the chat flow:
`protocol` (the request), `translate` (in and out, whole and streamed, errors)."""

from pflash.api.messages.protocol import MessagesRequest
from pflash.api.messages.translate import EDGE, MessagesExchange

__all__ = ["EDGE", "MessagesExchange", "MessagesRequest"]
