"""The OpenAI Responses API (`POST /v1/responses`, `POST /v1/responses/input_tokens`) as a
translation onto the chat flow: `protocol` (the request), `tools` (its tools as chat
functions, and calls back as its items), `translate` (in and out, whole and streamed, the
count). The server is stateless: `previous_response_id` and `conversation` are a 400, the
client sends the whole input."""
