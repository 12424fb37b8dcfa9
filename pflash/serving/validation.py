"""A request body validated as its API's model, and a pydantic `ValidationError` as the
`InvalidRequest` (a 400) whose `param` names the bad field in that API's own terms:
`messages[2].role` for chat completions and completions (`invalid_request_from`, which also
names the field of a validation error raised anywhere else), `messages[1].content[0]` for an
API served by translation (`FieldNames`, `invalid_request`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from pflash.errors import InvalidRequest
from pflash.serving.body import json_object
from pflash.serving.chat_completion.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionCall,
    FunctionDefinition,
    NamedToolChoice,
    Tool,
    ToolCall,
)
from pflash.serving.completion.protocol import CompletionRequest
from pflash.serving.output_format import JSONSchemaFormat, JSONSchemaSpec
from pflash.serving.protocol import StreamOptions

Model = TypeVar("Model", bound=BaseModel)

# ---------------------------------------------------------------------- chat and completions


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


# ---------------------------------------------------------------------- the edge APIs


@dataclass(frozen=True)
class FieldNames:
    """How an edge API names its fields in errors: `fields`, every field name of its
    request models; `tags`, the labels pydantic gives a union's members after a list index
    (the block or item type), which are left out of a path."""

    fields: frozenset[str]
    tags: frozenset[str]

    @classmethod
    def of(cls, models: tuple[type[BaseModel], ...], tags: frozenset[str]) -> FieldNames:
        return cls(
            frozenset(f.alias or name for m in models for name, f in m.model_fields.items()), tags
        )

    def param(self, loc: tuple[Any, ...]) -> str | None:
        """("messages", 0, "content", 2, "tool_use", "id") -> "messages[0].content[2].id"."""
        out = ""
        for i, part in enumerate(loc):
            if isinstance(part, int):
                out += f"[{part}]"
            elif part in self.fields and not (
                part in self.tags and i > 0 and isinstance(loc[i - 1], int)
            ):
                out += f".{part}" if out else part
        return out or None


def invalid_request(err: ValidationError, names: FieldNames) -> InvalidRequest:
    """The first validation error of an edge API's request as an `InvalidRequest` naming its
    field in that API's terms (`messages[1].content[0]`)."""
    first = err.errors(include_url=False)[0]
    param = names.param(tuple(first.get("loc", ())))
    message = first["msg"]
    if first["type"] == "union_tag_invalid":
        ctx = first.get("ctx") or {}
        message = (
            f"type {ctx.get('tag', '?')!r} is not supported by this server "
            f"(supported: {ctx.get('expected_tags', '')})"
        )
    elif message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    code = "missing_required_parameter" if first["type"] == "missing" else "invalid_value"
    return InvalidRequest(f"{param}: {message}" if param else message, param=param, code=code)


def parse_body(
    model: type[Model], body: bytes | str | Mapping[str, Any], names: FieldNames | None = None
) -> Model:
    """`body` validated as `model`, with the JSON limits every endpoint has (`serving.body`);
    `InvalidRequest` naming the bad field otherwise: in an edge API's terms (`names`), or,
    without them, in OpenAI's (`invalid_request_from`)."""
    data = json_object(body)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        error = invalid_request_from(err) if names is None else invalid_request(err, names)
        raise error from None
