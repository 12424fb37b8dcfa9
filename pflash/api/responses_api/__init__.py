"""The OpenAI Responses API (`POST /v1/responses`) as a translation onto the chat flow:
`protocol` (the request), `translate` (in and out, whole and streamed). The server is
stateless: `previous_response_id` is a 400, the client sends the whole input."""

from pflash.api.responses_api.protocol import ResponsesRequest
from pflash.api.responses_api.translate import EDGE, ResponsesExchange

__all__ = ["EDGE", "ResponsesExchange", "ResponsesRequest"]
