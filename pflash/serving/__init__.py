"""The edge: every HTTP API the gateway serves, laid out like vLLM's entrypoints.

Per API a package with its `protocol` (the request and response models) and its serving or
translation: `chat_completion/` and `completion/` (OpenAI's: the request parsed, the answer
written by an `answer.Answer` strategy), `messages/` (Anthropic Messages) and `responses/`
(OpenAI Responses), the last two translated onto the chat request and back (`edge`).

The flow every route delegates to is `gateway` (authorize, read, admit, render, plan) and
`answer` (one `Call` record; the target's events made into the answer, whole or streamed).
One `middleware` gives each request its id and answers an escaped error in its API's
envelope (`envelope`, the one mapping of exceptions to HTTP). What the APIs share: request
bodies read with limits (`body`), validation errors named in each API's terms
(`validation`), the fields both OpenAI requests have (`protocol`), usage and PFlash's stats
(`usage`), tool calls read from the answer (`tool_calls`), the requested output format
(`output_format`) and the model listing (`models`). Around them: what a request must pass
first (`admission`), whose it is (`tenants`), `/readyz` (`readiness`) and the metric names
(`metrics`).

Import each name from its module; this package exports nothing itself.
"""
