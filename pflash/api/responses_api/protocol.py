"""The OpenAI Responses API (`POST /v1/responses`, and `POST /v1/responses/input_tokens` for
its conversation alone): the request as its SDK and the OpenAI Agents SDK send it.

`input` is a string (one user message) or items: `message` (its `type` may be left out;
content a string or `input_text` / `output_text` parts), `function_call` and
`function_call_output`. Tools are flat function tools (`{"type": "function", "name",
"parameters"}`). The server is stateless: `previous_response_id` and `conversation` are a
400 asking for the whole input, and `store` is accepted and changes nothing. Accepted and ignored:
`metadata`, `parallel_tool_calls`, `user`, `text.verbosity`, `reasoning`, `truncation`,
`include`. `text.format` asks for JSON (`api.output_format`).
Other item, part and tool kinds (images, files, reasoning items, hosted tools) are a 400
naming them. PFlash's own fields and `seed` ride at the top level (the SDK's `extra_body`)
and are validated by the chat request.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    field_validator,
)

from pflash.api.edge import FieldNames
from pflash.api.output_format import FlatJSONSchemaFormat, ResponsesText

_CONFIG = ConfigDict(strict=True, extra="ignore")


class TextPart(BaseModel):
    """Text the client or, in earlier output replayed as input, the model wrote."""

    model_config = _CONFIG

    type: Literal["input_text", "output_text"]
    text: str


def _as_parts(v: Any) -> Any:
    """Content given as a string is one text part: one shape for the translation to read."""
    return [{"type": "input_text", "text": v}] if isinstance(v, str) else v


class MessageItem(BaseModel):
    model_config = _CONFIG

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: list[TextPart]

    content_as_parts = field_validator("content", mode="before")(_as_parts)


class FunctionCallItem(BaseModel):
    """A call the model made earlier, replayed by the client."""

    model_config = _CONFIG

    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str


class FunctionCallOutputItem(BaseModel):
    model_config = _CONFIG

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: list[TextPart]

    output_as_parts = field_validator("output", mode="before")(_as_parts)


def _item_kind(v: Any) -> str | None:
    """The item's `type`; a message may leave it out (the SDK's "easy" input message)."""
    if isinstance(v, dict):
        return v.get("type", "message")
    return getattr(v, "type", None)


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Discriminator(_item_kind),
]


class FunctionTool(BaseModel):
    model_config = _CONFIG

    type: Literal["function"]
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionChoice(BaseModel):
    """`tool_choice: {"type": "function", "name": ...}`."""

    model_config = _CONFIG

    type: Literal["function"]
    name: str = Field(min_length=1)


class InputTokensRequest(BaseModel):
    """`POST /v1/responses/input_tokens`: the conversation of a Responses request, without
    what only generation reads. Extra top-level fields are kept (`model_extra`) so the
    PFlash ones reach the chat request; the rest are ignored there."""

    model_config = ConfigDict(strict=True, extra="allow")

    model: str | None = None
    input: list[InputItem]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None
    conversation: Any = None

    @field_validator("input", mode="before")
    @classmethod
    def _input_as_items(cls, v: Any) -> Any:
        return [{"role": "user", "content": v}] if isinstance(v, str) else v

    @field_validator("input")
    @classmethod
    def _input_not_empty(cls, v: list[Any]) -> list[Any]:
        if not v:
            raise ValueError("input must not be empty")
        return v

    @field_validator("previous_response_id", "conversation")
    @classmethod
    def _stateless(cls, v: Any, info: ValidationInfo) -> Any:
        if v is not None:
            raise ValueError(
                "this server is stateless and keeps no responses or conversations: send the "
                f"whole conversation as input instead of {info.field_name}"
            )
        return v


class ResponsesRequest(InputTokensRequest):
    """`POST /v1/responses`: the conversation and how to generate the answer."""

    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool = False
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    text: ResponsesText | None = None


NAMES = FieldNames.of(
    (ResponsesRequest, MessageItem, TextPart, FunctionCallItem, FunctionCallOutputItem,
     FunctionTool, FunctionChoice, ResponsesText, FlatJSONSchemaFormat),
    tags=frozenset({"message", "function_call", "function_call_output"}),
)  # fmt: skip
