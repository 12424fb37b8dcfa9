"""The Anthropic Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`) as a
translation onto the chat flow: `protocol` (the request), `translate` (in and out, whole and
streamed, errors, the count); `models`, the served models as Anthropic clients list them."""
