"""The Anthropic Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`) as a
translation onto the chat flow: `protocol` (the request), `translate` (in and out, whole and
streamed, errors, the count); `models`, the served models as Anthropic clients list them."""

from pflash.api.messages import models
from pflash.api.messages.protocol import CountTokensRequest, MessagesRequest
from pflash.api.messages.translate import COUNT, EDGE, MessagesExchange

__all__ = ["models", "COUNT", "EDGE", "CountTokensRequest", "MessagesExchange", "MessagesRequest"]
