"""`POST /v1/completions`: the request (one prompt, text or token ids, on top of the shared
generation fields) and the response, whose shape is also the stream's chunk."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator
from pydantic_core import PydanticCustomError

from pflash.serving.protocol import GenerationRequest, absent
from pflash.serving.usage import Usage


class CompletionRequest(GenerationRequest):
    """`POST /v1/completions`. `prompt` is one string or one list of token ids."""

    prompt: str | list[int]

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, v: Any) -> Any:
        if isinstance(v, list) and v and all(isinstance(p, str) for p in v):
            if len(v) != 1:
                raise PydanticCustomError(
                    "unsupported_value", "only one prompt per request is supported"
                )
            v = v[0]
        if isinstance(v, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in v):
            if not v:
                raise PydanticCustomError("invalid_value", "prompt must not be empty")
            return v
        if isinstance(v, str):
            if not v:
                raise PydanticCustomError("invalid_value", "prompt must not be empty")
            return v
        raise PydanticCustomError("invalid_type", "prompt must be a string or a list of token ids")


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: Literal["stop", "length"] | None = None
    logprobs: None = None


class CompletionResponse(BaseModel):
    """`/v1/completions` response and (`object` the same, as OpenAI does) stream chunk."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = Field(None, exclude_if=absent)
    pflash_prompt: str | None = Field(None, exclude_if=absent)
