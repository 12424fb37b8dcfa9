"""OpenAI chat completions (`POST /v1/chat/completions`): `protocol` (the request and
response models), `serving` (the request parsed, the answer written whole or streamed)."""
