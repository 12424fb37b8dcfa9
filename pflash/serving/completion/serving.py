"""`/v1/completions` served: the request parsed, the answer written as one
`CompletionResponse` or as chunks of the same shape (`CompletionAnswer`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pflash.models.target.protocol import FinishReason, GenerationDone
from pflash.serving.answer import Call
from pflash.serving.completion.protocol import (
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
)
from pflash.serving.protocol import ResponseMeta
from pflash.serving.usage import Usage
from pflash.serving.validation import parse_body


def parse_completion_request(body: bytes | str | Mapping[str, Any]) -> CompletionRequest:
    """Validate a `/v1/completions` body; raise `InvalidRequest` naming the bad field."""
    return parse_body(CompletionRequest, body)


def _completion_finish(reason: FinishReason | None) -> Literal["stop", "length"] | None:
    return None if reason is None else "length" if reason == "length" else "stop"


def completion_chunk(
    meta: ResponseMeta,
    text: str = "",
    *,
    finish_reason: FinishReason | None = None,
    usage: Usage | None = None,
    pflash_prompt: str | None = None,
) -> CompletionResponse:
    """A streamed completion piece; with `usage` and a finish reason, the whole response."""
    choice = CompletionChoice(text=text, finish_reason=_completion_finish(finish_reason))
    return CompletionResponse(
        **meta.fields(), choices=[choice], usage=usage, pflash_prompt=pflash_prompt
    )


def completion_response(
    meta: ResponseMeta,
    text: str,
    finish_reason: FinishReason,
    usage: Usage,
    *,
    pflash_prompt: str | None = None,
) -> CompletionResponse:
    return completion_chunk(
        meta, text, finish_reason=finish_reason, usage=usage, pflash_prompt=pflash_prompt
    )


def completion_usage_chunk(
    meta: ResponseMeta, usage: Usage, *, pflash_prompt: str | None = None
) -> CompletionResponse:
    """The `stream_options.include_usage` chunk: no choices, only usage."""
    return CompletionResponse(**meta.fields(), choices=[], usage=usage, pflash_prompt=pflash_prompt)


class CompletionAnswer:
    """The completion of one call (`answer.Answer`): the text as generated; the served
    prompt, when asked for, rides on the last chunk."""

    kind = "completion"
    id_prefix = "cmpl-"
    parse = staticmethod(parse_completion_request)

    def __init__(self, call: Call, prompt: str | None) -> None:
        self.meta, self.prompt = call.meta, prompt

    def whole(self, text: str, done: GenerationDone, usage: Usage) -> CompletionResponse:
        return completion_response(
            self.meta, text, done.finish_reason, usage, pflash_prompt=self.prompt
        )

    def opening(self) -> list[CompletionResponse]:
        return []

    def piece(self, text: str) -> list[CompletionResponse]:
        return [completion_chunk(self.meta, text)] if text else []

    def closing(self, done: GenerationDone) -> list[CompletionResponse]:
        finish = done.finish_reason
        return [completion_chunk(self.meta, finish_reason=finish, pflash_prompt=self.prompt)]

    def usage(self, usage: Usage) -> CompletionResponse:
        return completion_usage_chunk(self.meta, usage)
