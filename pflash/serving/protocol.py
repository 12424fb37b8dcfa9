"""What `/v1/chat/completions` and `/v1/completions` share: the generation fields and
PFlash's extensions of a request (`GenerationRequest`), validated once with strict types ("5"
is not an integer, 1 is not a boolean), and what every response and chunk of one request
carries (`ResponseMeta`). Each API's own models are in `chat_completion.protocol` and
`completion.protocol`; a validation failure becomes an `InvalidRequest` whose `param` names
the field (`serving.validation`), so the edge answers 400 in the OpenAI error shape.

Fields OpenAI defines that do not change the response shape (`frequency_penalty`,
`presence_penalty`, ...) are accepted and ignored (`user` too, once it checks as an
identifier, as `session_id` does); `response_format` asks the target for JSON
(`serving.output_format`: a 400 where the target cannot constrain its decoding); `tools` and
`tool_choice` decide which hermes-format calls in the answer become `tool_calls`
(`serving.tool_calls`); fields that would
change it and are not supported (`n > 1`, `logprobs`, `echo`, `best_of`, `suffix`) are 400s.
An unknown `pflash_*` field is a 400 too, so a misspelt extension never goes unnoticed.
Text the server searches or matches is bounded here (`MAX_*`): the query and required
strings are searched for in the whole prompt, stop strings after every token.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from pflash.config import AdmissionPart, RequestOverrides
from pflash.errors import InvalidRequest, ModelNotFound
from pflash.models.target.protocol import SamplingParams
from pflash.serving.output_format import ResponseFormat, output_format

PFlashMode = Literal["off", "auto", "always"]

MAX_STOP_SEQUENCES = 16  # each is matched after every token; OpenAI allows 4
MAX_STOP_CHARS = 256  # per stop string: what a backend holds back while an answer streams
# the explicit query and each required string are searched for in the whole prompt
MAX_QUERY_CHARS = 8_192
MAX_REQUIRED_STRINGS = 16
MAX_REQUIRED_CHARS = 4_096
# identifiers (session_id, user) reach HTTP headers and cache keys: printable ASCII only
MAX_IDENTIFIER_CHARS = 256
REQUEST_CONFIG = ConfigDict(strict=True, extra="ignore", validate_default=True)


def absent(value: Any) -> bool:
    """`exclude_if` of an optional response field: left out of the body while unset."""
    return value is None


def _unsupported(param: str, message: str) -> PydanticCustomError:
    """A validation error that names its own `param` (used where the loc cannot)."""
    return PydanticCustomError("unsupported_value", message, {"param": param})


class StreamOptions(BaseModel):
    model_config = REQUEST_CONFIG

    include_usage: bool = False


QueryStr = Annotated[str, Field(min_length=1, max_length=MAX_QUERY_CHARS)]
RequiredStr = Annotated[str, Field(min_length=1, max_length=MAX_REQUIRED_CHARS)]


def check_identifier(value: str | None) -> str | None:
    """`value` as an identifier: 1 to `MAX_IDENTIFIER_CHARS` printable ASCII characters,
    no space at either end. Why: a session id is sent upstream as an HTTP header, where a
    non-ASCII character fails inside the HTTP client and CR/LF would split the header, so a
    client's mistake would surface as a 5xx blamed on the upstream."""
    if value is None:
        return None
    if not (
        0 < len(value) <= MAX_IDENTIFIER_CHARS
        and value.isascii()
        and value.isprintable()
        and value == value.strip(" ")
    ):
        raise PydanticCustomError(
            "invalid_value",
            f"must be 1 to {MAX_IDENTIFIER_CHARS} printable ASCII characters, "
            "without spaces at either end",
        )
    return value


# fields that would change the response shape: the value each may take ("absent" = None)
_UNSUPPORTED_FIELDS: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
}


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same type (so False is not 0)."""
    return type(a) is type(b) and a == b


class GenerationRequest(BaseModel):
    """Fields shared by `/v1/chat/completions` and `/v1/completions`."""

    model_config = REQUEST_CONFIG

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: tuple[str, ...] = ()
    seed: int | None = Field(None, ge=-(2**63), lt=2**64)  # what a 64-bit sampler seed holds
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    response_format: ResponseFormat | None = None
    # PFlash extensions (top level, or via the OpenAI SDK's extra_body)
    pflash_mode: PFlashMode | None = None
    pflash_keep_ratio: float | None = Field(None, gt=0, le=1)
    pflash_query: QueryStr | None = None
    pflash_required: list[RequiredStr] | None = Field(None, max_length=MAX_REQUIRED_STRINGS)
    session_id: str | None = None
    # OpenAI's end-user id: bounded, never used (it reaches no header, so any text is fine)
    user: str | None = Field(None, max_length=MAX_IDENTIFIER_CHARS)
    pflash_return_prompt: bool = False

    _identifiers = field_validator("session_id")(check_identifier)

    @model_validator(mode="before")
    @classmethod
    def _reject_unsupported(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        known = set(cls.model_fields)
        for key in data:
            if isinstance(key, str) and key.startswith("pflash_") and key not in known:
                raise _unsupported(key, f"unknown PFlash field {key!r}")
        for key, allowed in _UNSUPPORTED_FIELDS.items():
            if key in data and not any(_same(data[key], a) for a in allowed):
                raise _unsupported(key, f"{key} is not supported by this server")
        return data

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_as_tuple(cls, v: Any) -> Any:
        if v is None or v == ():
            return ()
        items = [v] if isinstance(v, str) else v
        if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
            raise PydanticCustomError(
                "invalid_type", "stop must be a non-empty string or a list of them"
            )
        if any(len(s) > MAX_STOP_CHARS for s in items):
            raise PydanticCustomError(
                "invalid_value", f"each stop sequence has at most {MAX_STOP_CHARS} characters"
            )
        if len(items) > MAX_STOP_SEQUENCES:
            raise PydanticCustomError(
                "invalid_value", f"at most {MAX_STOP_SEQUENCES} stop sequences are allowed"
            )
        return tuple(items)

    @field_validator("n")
    @classmethod
    def _only_one_choice(cls, v: int | None) -> int | None:
        if v is not None and v != 1:
            raise PydanticCustomError("unsupported_value", "only n=1 is supported")
        return v

    @field_validator("pflash_keep_ratio")
    @classmethod
    def _finite_ratio(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise PydanticCustomError(
                "invalid_value", "pflash_keep_ratio must be a finite number in (0, 1]"
            )
        return v

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> GenerationRequest:
        if self.stream_options is not None and not self.stream:
            raise _unsupported(
                "stream_options", "stream_options is only allowed when stream is true"
            )
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def _max_tokens(self) -> int | None:
        return self.max_tokens

    def sampling_params(self) -> SamplingParams:
        """OpenAI defaults: temperature 1, top_p 1, no token limit beyond the context."""
        return SamplingParams(
            max_tokens=self._max_tokens(),
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            stop=self.stop,
            seed=self.seed,
            output_format=output_format(self.response_format),
        )

    def overrides(self) -> RequestOverrides:
        """What this request changes in the server's config (`pflash_mode`,
        `pflash_keep_ratio`)."""
        return RequestOverrides(mode=self.pflash_mode, keep_ratio=self.pflash_keep_ratio)

    def check_allowed(self, config: AdmissionPart) -> None:
        """Rules that depend on the server's config; raise `InvalidRequest` when broken."""
        if self.model is not None and self.model not in config.served_model_names:
            raise ModelNotFound(self.model, config.served_model_names)
        if len(getattr(self, "messages", ())) > config.max_messages:
            raise InvalidRequest(
                f"{len(self.messages)} messages exceed this server's limit of "
                f"{config.max_messages} (max_messages)",
                param="messages",
                code="too_many_messages",
            )
        if self.pflash_return_prompt and not config.return_prompt_enabled:
            raise InvalidRequest(
                "pflash_return_prompt is disabled on this server (return_prompt_enabled)",
                param="pflash_return_prompt",
                code="unsupported_value",
            )
        if self.pflash_required and not config.selection.strict:
            raise InvalidRequest(
                "pflash_required needs strict selection (select_mode is legacy)",
                param="pflash_required",
                code="unsupported_value",
            )


@dataclass(frozen=True)
class ResponseMeta:
    """What every response and chunk of one request shares."""

    id: str
    model: str
    created: int

    @classmethod
    def new(cls, model: str, id_prefix: str) -> ResponseMeta:
        """A new response of `model`, its id `id_prefix` (the API's: "chatcmpl-") + hex."""
        return cls(id_prefix + uuid.uuid4().hex, model, int(time.time()))

    def fields(self) -> dict[str, Any]:
        return {"id": self.id, "model": self.model, "created": self.created}
