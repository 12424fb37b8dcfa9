"""The edge: every HTTP API the gateway serves, laid out like vLLM's entrypoints.

Per API a package with its `protocol` (the request and response models) and its serving or
translation: `chat_completion/` and `completion/` (OpenAI's), `messages/` (Anthropic
Messages) and `responses/` (OpenAI Responses), the last two served by translation onto the
chat request (`edge`). What they share: request bodies read with limits (`body`), validation
errors named in each API's terms (`validation`), the fields both OpenAI requests have
(`protocol`), usage and PFlash's stats (`usage`), the error envelope and SSE framing
(`envelope`), tool calls read from the answer (`tool_calls`), the requested output format
(`output_format`) and the model listing (`models`). Around them: what a request must pass
first (`admission`), whose it is (`tenants`), `/readyz` (`readiness`) and the metric names
(`metrics`).

Import each name from its module; this package exports nothing itself.
"""
