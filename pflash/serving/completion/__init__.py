"""OpenAI completions (`POST /v1/completions`): `protocol` (the request and response
models), `serving` (the request parsed, the answer written whole or streamed)."""
