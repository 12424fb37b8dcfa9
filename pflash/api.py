"""The OpenAI surface: request and response models, the error envelope, SSE framing.

Requests are validated once, here, with strict types ("5" is not an integer, 1 is not a
boolean). Every validation failure becomes an `InvalidRequest` whose `param` names the
field (`messages[2].role`), so the ingress answers 400 in the OpenAI error shape.
Responses follow OpenAI's shapes plus llama.cpp-style `usage.timings` and PFlash's
`usage.timings.pflash` (`PFlashStats`, ALGORITHM §5.9). `error_response` is the one place
where exceptions become HTTP statuses and bodies.

Fields OpenAI defines that do not change the response shape (`user`, `tool_choice`,
`frequency_penalty`, `response_format`, ...) are accepted and ignored; fields that would
change it and are not supported (`n > 1`, `logprobs`, `echo`, `best_of`, `suffix`) are 400s.
An unknown `pflash_*` field is a 400 too, so a misspelt extension never goes unnoticed.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from pflash.config import PFlashConfig
from pflash.errors import InvalidRequest, PFlashError
from pflash.models.target import FinishReason, GenerationTimings, SamplingParams

Role = Literal["system", "developer", "user", "assistant", "tool"]
PFlashMode = Literal["off", "auto", "always"]
ViewMode = Literal["off", "fresh", "repeat", "continue", "continue-compressed", "rebuild"]

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
        if v is None or isinstance(v, str):
            return v
        if not isinstance(v, list):
            raise PydanticCustomError(
                "invalid_type", "content must be a string or a list of text parts"
            )
        texts = []
        for i, part in enumerate(v):
            if not (
                isinstance(part, dict)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
            ):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise PydanticCustomError(
                    "invalid_value",
                    f"content part {i} has type {kind!r}: only text parts "
                    '({"type": "text", "text": "..."}) are supported',
                )
            texts.append(part["text"])
        return "\n".join(texts)

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
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    # PFlash extensions (top level, or via the OpenAI SDK's extra_body)
    pflash_mode: PFlashMode | None = None
    pflash_keep_ratio: float | None = Field(None, gt=0, le=1)
    pflash_query: NonEmptyStr | None = None
    pflash_required: list[NonEmptyStr] | None = None
    session_id: str | None = Field(None, min_length=1, max_length=256)
    pflash_return_prompt: bool = False

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
        )

    def check_allowed(self, config: PFlashConfig) -> None:
        """Rules that depend on the server's config; raise `InvalidRequest` when broken."""
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
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("messages")
    @classmethod
    def _messages_not_empty(cls, v: list[ChatMessage]) -> list[ChatMessage]:
        if not v:
            raise PydanticCustomError("invalid_value", "messages must not be empty")
        return v

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
                  FunctionDefinition, StreamOptions):  # fmt: skip
        names.update(model.model_fields)
    return frozenset(names)


_FIELDS = _field_names()


def _param_from_loc(loc: tuple[Any, ...]) -> str | None:
    """("messages", 0, "role") -> "messages[0].role"; pydantic's union/tag labels are dropped."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
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
    value = first.get("input")
    if (
        first["type"] != "missing"
        and isinstance(value, str | int | float | bool)
        and "param" not in ctx
    ):
        message = f"{message} (got {value!r})"
    return InvalidRequest(
        f"{param}: {message}" if param else message, param=param, code=_code_for(first["type"])
    )


def _parse(model: type[_GenerationRequest], body: bytes | str | Mapping[str, Any]) -> Any:
    if isinstance(body, bytes | str):
        try:
            body = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InvalidRequest(
                f"request body is not valid JSON: {exc}", code="invalid_json"
            ) from None
    if not isinstance(body, Mapping):
        raise InvalidRequest("request body must be a JSON object", code="invalid_type")
    try:
        return model.model_validate(dict(body))
    except ValidationError as err:
        raise invalid_request_from(err) from None


def parse_chat_request(body: bytes | str | Mapping[str, Any]) -> ChatCompletionRequest:
    """Validate a `/v1/chat/completions` body; raise `InvalidRequest` naming the bad field."""
    return _parse(ChatCompletionRequest, body)


def parse_completion_request(body: bytes | str | Mapping[str, Any]) -> CompletionRequest:
    """Validate a `/v1/completions` body; raise `InvalidRequest` naming the bad field."""
    return _parse(CompletionRequest, body)


# ---------------------------------------------------------------------- usage and stats


class ViewStats(BaseModel):
    """The multi-turn view outcome (ALGORITHM §6.1), in target tokens. "off": no view."""

    model_config = ConfigDict(extra="forbid")

    mode: ViewMode = "off"
    turn: int = 0
    served_tokens: int = 0
    reused_tokens: int = 0
    delta_tokens: int = 0
    recalled_tokens: int = 0
    fresh_tokens: int = 0


class PFlashStats(BaseModel):
    """`usage.timings.pflash` (ALGORITHM §5.9). Defaults describe an uncompressed request.

    Units: `*_ms` milliseconds (`compress_ms` rounded to 0.1); `drafter_input_tokens` and
    `kept_tokens` drafter tokens; `compressed_tokens` target tokens served; `keep_ratio`
    the final effective ratio; `segments` candidate segments; `scorer_resume` the token
    position the drafter session resumed from; `lexical_units` / `lexical_kept` the text
    units sharing rare words with the question and how many of them were kept first
    (`select_lexical`). Unknown keys are an error, so the pipeline's
    stats and this contract cannot drift apart silently.
    """

    model_config = ConfigDict(extra="forbid")

    compress_ms: float = 0.0
    drafter_input_tokens: int = 0
    kept_tokens: int = 0
    compressed_tokens: int = 0
    keep_ratio: float = 1.0
    query_rule: str = ""
    history_queries: int = 0
    segments: int = 0
    stop_reason: str = ""
    scorer_resume: int = 0
    scorer_new_tokens: int = 0
    scorer_forward_ms: float = 0.0
    lexical_units: int = 0
    lexical_kept: int = 0
    view: ViewStats = Field(default_factory=ViewStats)

    @field_validator("compress_ms")
    @classmethod
    def _tenth_of_ms(cls, v: float) -> float:
        return round(v, 1)

    @classmethod
    def uncompressed(cls, prompt_tokens: int) -> PFlashStats:
        """Stats of a request served as is: all `prompt_tokens` served, ratio 1."""
        return cls(compressed_tokens=prompt_tokens, keep_ratio=1.0)


class Timings(BaseModel):
    """llama.cpp-style generation timings plus PFlash's stats."""

    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    cache_n: int
    pflash: PFlashStats = Field(default_factory=PFlashStats)


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    """`prompt_tokens` is the client's original prompt, not the compressed one (§8.2)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    timings: Timings


def build_usage(
    prompt_tokens: int, timings: GenerationTimings, pflash: PFlashStats | None = None
) -> Usage:
    """Usage of one generation: completion = sampled tokens, cached = reused prefix tokens."""
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=timings.predicted_n,
        total_tokens=prompt_tokens + timings.predicted_n,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=timings.cache_n),
        timings=Timings(
            prompt_n=timings.prompt_n,
            prompt_ms=round(timings.prompt_ms, 3),
            predicted_n=timings.predicted_n,
            predicted_ms=round(timings.predicted_ms, 3),
            cache_n=timings.cache_n,
            pflash=pflash or PFlashStats.uncompressed(prompt_tokens),
        ),
    )


# ---------------------------------------------------------------------- responses


def _absent(v: Any) -> bool:
    return v is None


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[dict[str, Any]] | None = Field(None, exclude_if=_absent)


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatResponseMessage
    finish_reason: FinishReason
    logprobs: None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    pflash_prompt: str | None = Field(None, exclude_if=_absent)


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = Field(None, exclude_if=_absent)
    content: str | None = Field(None, exclude_if=_absent)
    tool_calls: list[dict[str, Any]] | None = Field(None, exclude_if=_absent)


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    finish_reason: FinishReason | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = Field(None, exclude_if=_absent)
    pflash_prompt: str | None = Field(None, exclude_if=_absent)


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
    usage: Usage | None = Field(None, exclude_if=_absent)
    pflash_prompt: str | None = Field(None, exclude_if=_absent)


@dataclass(frozen=True)
class ResponseMeta:
    """What every response and chunk of one request shares."""

    id: str
    model: str
    created: int

    @classmethod
    def new(cls, model: str, kind: Literal["chat", "completion"]) -> ResponseMeta:
        prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
        return cls(prefix + uuid.uuid4().hex, model, int(time.time()))

    def fields(self) -> dict[str, Any]:
        return {"id": self.id, "model": self.model, "created": self.created}


def _completion_finish(reason: FinishReason | None) -> Literal["stop", "length"] | None:
    return None if reason is None else "length" if reason == "length" else "stop"


def chat_response(
    meta: ResponseMeta,
    text: str,
    finish_reason: FinishReason,
    usage: Usage,
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    pflash_prompt: str | None = None,
) -> ChatCompletionResponse:
    content = text if text or not tool_calls else None
    message = ChatResponseMessage(content=content, tool_calls=tool_calls or None)
    choice = ChatChoice(message=message, finish_reason=finish_reason)
    return ChatCompletionResponse(
        **meta.fields(), choices=[choice], usage=usage, pflash_prompt=pflash_prompt
    )


def chat_chunk(
    meta: ResponseMeta,
    *,
    role: Literal["assistant"] | None = None,
    content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    finish_reason: FinishReason | None = None,
    pflash_prompt: str | None = None,
) -> ChatCompletionChunk:
    """One streamed chat delta. The first carries `role="assistant"`, the last `finish_reason`."""
    delta = ChatDelta(role=role, content=content, tool_calls=tool_calls or None)
    choice = ChatChunkChoice(delta=delta, finish_reason=finish_reason)
    return ChatCompletionChunk(**meta.fields(), choices=[choice], pflash_prompt=pflash_prompt)


def chat_usage_chunk(
    meta: ResponseMeta, usage: Usage, *, pflash_prompt: str | None = None
) -> ChatCompletionChunk:
    """The `stream_options.include_usage` chunk: no choices, only usage."""
    return ChatCompletionChunk(
        **meta.fields(), choices=[], usage=usage, pflash_prompt=pflash_prompt
    )


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


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "pflash"
    max_model_len: int | None = Field(None, exclude_if=_absent)


class ModelList(BaseModel):
    """`GET /v1/models`."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


# ---------------------------------------------------------------------- errors and SSE


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """`{"error": {"message", "type", "param", "code"}}`: OpenAI's error envelope."""

    error: ErrorDetail


# Errors of the serving runtime, matched by class name so this module needs no Ray import:
# (status, type, code, message prefix). Walked along the exception's MRO.
_RUNTIME_ERRORS: dict[str, tuple[int, str, str, str]] = {
    "BackPressureError": (
        503,
        "overloaded_error",
        "backpressure",
        "server overloaded, retry later",
    ),
    "DeploymentUnavailableError": (
        503,
        "service_unavailable",
        "replica_unavailable",
        "service unavailable",
    ),
    "ReplicaUnavailableError": (
        503,
        "service_unavailable",
        "replica_unavailable",
        "service unavailable",
    ),
    "RayActorError": (
        503,
        "service_unavailable",
        "replica_unavailable",
        "a model replica died, retry",
    ),
    "TimeoutError": (504, "timeout_error", "timeout", "timed out"),
}


def error_response(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """The HTTP status and OpenAI error body for any exception. The only such mapping.

    `PFlashError`s carry their own status/type/param/code; a pydantic `ValidationError`
    is a 400 naming the field; serving-runtime failures (backpressure, a dead replica, a
    timeout) are 503/504; anything else is a 500 that names only the exception class.
    """
    if isinstance(exc, ValidationError):
        exc = invalid_request_from(exc)
    if isinstance(exc, PFlashError):
        status, detail = (
            exc.http_status,
            ErrorDetail(message=exc.message, type=exc.error_type, param=exc.param, code=exc.code),
        )
    else:
        known = next(
            (
                _RUNTIME_ERRORS[c.__name__]
                for c in type(exc).__mro__
                if c.__name__ in _RUNTIME_ERRORS
            ),
            None,
        )
        if known is not None:
            status, error_type, code, prefix = known
            detail = ErrorDetail(
                message=f"{prefix}: {exc}" if str(exc) else prefix, type=error_type, code=code
            )
        else:
            status = 500
            detail = ErrorDetail(
                message=f"internal server error ({type(exc).__name__})", type="server_error"
            )
    return status, ErrorResponse(error=detail).model_dump()


SSE_DONE = "data: [DONE]\n\n"
SSE_KEEPALIVE = ": keep-alive\n\n"


def sse_event(obj: BaseModel | Mapping[str, Any]) -> str:
    """One server-sent event carrying `obj` as compact JSON."""
    if isinstance(obj, BaseModel):
        payload = obj.model_dump_json()
    else:
        payload = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return f"data: {payload}\n\n"


def sse_error(exc: BaseException) -> str:
    """A mid-stream failure as an SSE event with the error envelope (the status is already sent)."""
    return sse_event(error_response(exc)[1])
