"""OpenAI request models and their parsing, validated once with strict types ("5" is not
an integer, 1 is not a boolean). Every validation failure becomes an `InvalidRequest` whose
`param` names the field (`messages[2].role`), so the ingress answers 400 in the OpenAI
error shape.

Fields OpenAI defines that do not change the response shape (`frequency_penalty`,
`presence_penalty`, ...) are accepted and ignored (`user` too, once it checks as an
identifier, as `session_id` does); `response_format` asks the target for JSON
(`api.output_format`: a 400 where the target cannot constrain its decoding); `tools` and
`tool_choice` decide which hermes-format calls in the answer become `tool_calls`
(`api.tool_calls`); fields that would
change it and are not supported (`n > 1`, `logprobs`, `echo`, `best_of`, `suffix`) are 400s.
An unknown `pflash_*` field is a 400 too, so a misspelt extension never goes unnoticed.
Text the server searches or matches is bounded here (`MAX_*`): the query and required
strings are searched for in the whole prompt, stop strings after every token.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from pflash.api.body import json_object
from pflash.api.output_format import (
    JSONSchemaFormat,
    JSONSchemaSpec,
    ResponseFormat,
    output_format,
    require_constraining_target,
)
from pflash.config import PFlashConfig, RequestOverrides
from pflash.errors import InvalidRequest, ModelNotFound
from pflash.message_content import content_text
from pflash.models.target.protocol import SamplingParams

Role = Literal["system", "developer", "user", "assistant", "tool"]
PFlashMode = Literal["off", "auto", "always"]

MAX_STOP_SEQUENCES = 16  # each is matched after every token; OpenAI allows 4
MAX_STOP_CHARS = 256  # per stop string: what a backend holds back while an answer streams
# the explicit query and each required string are searched for in the whole prompt
MAX_QUERY_CHARS = 8_192
MAX_REQUIRED_STRINGS = 16
MAX_REQUIRED_CHARS = 4_096
# identifiers (session_id, user) reach HTTP headers and cache keys: printable ASCII only
MAX_IDENTIFIER_CHARS = 256
_REQUEST_CONFIG = ConfigDict(strict=True, extra="ignore", validate_default=True)


def _unsupported(param: str, message: str) -> PydanticCustomError:
    """A validation error that names its own `param` (used where the loc cannot)."""
    return PydanticCustomError("unsupported_value", message, {"param": param})


# ---------------------------------------------------------------------- request models


class FunctionCall(BaseModel):
    model_config = _REQUEST_CONFIG

    name: str
    arguments: str


class ToolCall(BaseModel):
    model_config = _REQUEST_CONFIG

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDefinition(BaseModel):
    model_config = _REQUEST_CONFIG

    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    model_config = _REQUEST_CONFIG

    type: Literal["function"]
    function: FunctionDefinition


class _ToolName(BaseModel):
    model_config = _REQUEST_CONFIG

    name: str


class NamedToolChoice(BaseModel):
    """`tool_choice: {"type": "function", "function": {"name": ...}}`."""

    model_config = _REQUEST_CONFIG

    type: Literal["function"]
    function: _ToolName


class ChatMessage(BaseModel):
    """One chat message. `content` is normalised to a string: text parts join with "\\n".

    Role rules (OpenAI's): system/developer/user/tool messages need content; a tool
    message needs `tool_call_id`; only assistant messages carry `tool_calls`, and an
    assistant message needs content or tool calls.
    """

    model_config = _REQUEST_CONFIG

    role: Role
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    content: str | None = None
    reasoning_content: str | None = None

    @field_validator("tool_calls")
    @classmethod
    def _tool_calls_only_on_assistant(cls, v: list[ToolCall] | None, info) -> list[ToolCall] | None:
        if v is not None and info.data.get("role", "assistant") != "assistant":
            raise PydanticCustomError("invalid_value", "only assistant messages carry tool_calls")
        return v

    @field_validator("tool_call_id")
    @classmethod
    def _tool_call_id_on_tool(cls, v: str | None, info) -> str | None:
        if v is None and info.data.get("role") == "tool":
            raise PydanticCustomError("missing", "a tool message needs tool_call_id")
        return v

    @field_validator("content", mode="before")
    @classmethod
    def _content_as_text(cls, v: Any) -> Any:
        try:
            return content_text(v)
        except InvalidRequest as err:
            raise PydanticCustomError(err.code or "invalid_value", err.message) from None

    @field_validator("content")
    @classmethod
    def _content_required(cls, v: str | None, info) -> str | None:
        role = info.data.get("role")
        if v is None and role in ("system", "developer", "user", "tool"):
            raise PydanticCustomError("missing", "a {role} message needs content", {"role": role})
        if v is None and role == "assistant" and not info.data.get("tool_calls"):
            raise PydanticCustomError("missing", "an assistant message needs content or tool_calls")
        return v


class StreamOptions(BaseModel):
    model_config = _REQUEST_CONFIG

    include_usage: bool = False


NonEmptyStr = Annotated[str, Field(min_length=1)]
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


class _GenerationRequest(BaseModel):
    """Fields shared by `/v1/chat/completions` and `/v1/completions`."""

    model_config = _REQUEST_CONFIG

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

    # the field a client named the format by: an edge API sets its own (`text.format`)
    _format_param: str = PrivateAttr("response_format")

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
    def _stream_options_need_stream(self) -> _GenerationRequest:
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

    def name_format_param(self, param: str) -> None:
        """Errors about the output format name `param` (the edge API's own field)."""
        self._format_param = param

    def overrides(self) -> RequestOverrides:
        """What this request changes in the server's config (`pflash_mode`,
        `pflash_keep_ratio`)."""
        return RequestOverrides(mode=self.pflash_mode, keep_ratio=self.pflash_keep_ratio)

    def check_allowed(self, config: PFlashConfig) -> None:
        """Rules that depend on the server's config; raise `InvalidRequest` when broken."""
        if self.model is not None and self.model not in config.served_model_names:
            raise ModelNotFound(self.model, config.served_model_names)
        require_constraining_target(
            output_format(self.response_format), config.target_backend, self._format_param
        )
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
        if self.pflash_required and not config.strict:
            raise InvalidRequest(
                "pflash_required needs strict selection (select_mode is legacy)",
                param="pflash_required",
                code="unsupported_value",
            )


class ChatCompletionRequest(_GenerationRequest):
    """`POST /v1/chat/completions`."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("messages")
    @classmethod
    def _messages_not_empty(cls, v: list[ChatMessage]) -> list[ChatMessage]:
        if not v:
            raise PydanticCustomError("invalid_value", "messages must not be empty")
        return v

    @model_validator(mode="after")
    def _named_tool_is_declared(self) -> ChatCompletionRequest:
        if isinstance(self.tool_choice, NamedToolChoice):
            name = self.tool_choice.function.name
            if name not in {t.function.name for t in self.tools or ()}:
                raise PydanticCustomError(
                    "invalid_value",
                    "names the function '{name}', which is not among tools",
                    {"name": name, "param": "tool_choice"},
                )
        return self

    def _max_tokens(self) -> int | None:
        return (
            self.max_completion_tokens
            if self.max_completion_tokens is not None
            else self.max_tokens
        )

    def template_messages(self) -> list[dict[str, Any]]:
        """Messages as plain dicts for a chat template (absent fields left out)."""
        return [m.model_dump(exclude_none=True) for m in self.messages]

    def template_tools(self) -> list[dict[str, Any]] | None:
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None

    def callable_tools(self) -> frozenset[str]:
        """Names of the functions the answer may call: none when the request declares no
        tools or sets `tool_choice: "none"`; only the named one for a named choice."""
        if not self.tools or self.tool_choice == "none":
            return frozenset()
        if isinstance(self.tool_choice, NamedToolChoice):
            return frozenset({self.tool_choice.function.name})
        return frozenset(t.function.name for t in self.tools)


class CompletionRequest(_GenerationRequest):
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


# ---------------------------------------------------------------------- parsing


def _field_names() -> frozenset[str]:
    names: set[str] = set()
    for model in (ChatCompletionRequest, CompletionRequest, ChatMessage, ToolCall, FunctionCall, Tool,
                  FunctionDefinition, StreamOptions, NamedToolChoice, JSONSchemaFormat,
                  JSONSchemaSpec):  # fmt: skip
        names.update(f.alias or name for name, f in model.model_fields.items())
    return frozenset(names)


_FIELDS = _field_names()


# tagged unions outside lists: the tag pydantic puts after the field is a label, not a field
_TAGS_AFTER = {"response_format": frozenset({"text", "json_object", "json_schema"})}


def _param_from_loc(loc: tuple[Any, ...]) -> str | None:
    """("messages", 0, "role") -> "messages[0].role"; pydantic's union/tag labels are dropped."""
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif i > 0 and part in _TAGS_AFTER.get(loc[i - 1], ()):
            continue
        elif part in _FIELDS:
            out += f".{part}" if out else part
    return out or None


def _code_for(error_type: str) -> str:
    if error_type == "missing":
        return "missing_required_parameter"
    if error_type == "unsupported_value":
        return "unsupported_value"
    if error_type.endswith("_type") or error_type == "invalid_type":
        return "invalid_type"
    return "invalid_value"


def invalid_request_from(err: ValidationError) -> InvalidRequest:
    """The first validation error as an `InvalidRequest` naming its field."""
    first = err.errors(include_url=False)[0]
    ctx = first.get("ctx") or {}
    param = ctx.get("param") or _param_from_loc(tuple(first.get("loc", ())))
    message = first["msg"]
    if first["type"] == "union_tag_invalid":
        tag, expected = ctx.get("tag", "?"), ctx.get("expected_tags", "")
        message = f"type {tag!r} is not supported (supported: {expected})"
    elif message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    value = first.get("input")
    if (
        first["type"] != "missing"
        and isinstance(value, str | int | float | bool)
        and "param" not in ctx
    ):
        shown = repr(value)
        message = f"{message} (got {shown if len(shown) <= 80 else shown[:77] + '...'})"
    return InvalidRequest(
        f"{param}: {message}" if param else message, param=param, code=_code_for(first["type"])
    )


def _parse(model: type[_GenerationRequest], body: bytes | str | Mapping[str, Any]) -> Any:
    data = json_object(body)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise invalid_request_from(err) from None


def parse_chat_request(body: bytes | str | Mapping[str, Any]) -> ChatCompletionRequest:
    """Validate a `/v1/chat/completions` body; raise `InvalidRequest` naming the bad field."""
    return _parse(ChatCompletionRequest, body)


def parse_completion_request(body: bytes | str | Mapping[str, Any]) -> CompletionRequest:
    """Validate a `/v1/completions` body; raise `InvalidRequest` naming the bad field."""
    return _parse(CompletionRequest, body)
