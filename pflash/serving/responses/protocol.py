"""The OpenAI Responses API (`POST /v1/responses`, and `POST /v1/responses/input_tokens` for
its conversation alone): the request as its SDK, the OpenAI Agents SDK and Codex CLI send it.

`input` is a string (one user message) or items: `message` (its `type` may be left out;
content a string or `input_text` / `output_text` parts), `function_call` (with the
`namespace` of a namespaced function) and `function_call_output`, `custom_tool_call` and
`custom_tool_call_output`, and `reasoning` (the model's own earlier reasoning, which this
server's targets cannot read back: dropped). Tools are function tools (`{"type": "function",
"name", "parameters"}`), `namespace` tools (functions grouped under a name), `custom` tools
(free-text input, optionally in a grammar), and hosted tools (`web_search`, `file_search`,
...), which OpenAI runs on its servers: they are not offered to the model and the response
says so (`x-pflash-tools-not-offered`). The server is stateless: `previous_response_id`,
`conversation` and `background` are a 400 asking for the whole input, and `store` is
accepted and changes nothing. `prompt_cache_key` names the client's session (affinity).
Accepted and ignored: `metadata`, `client_metadata`, `parallel_tool_calls`, `user`,
`text.verbosity`, `reasoning`, `truncation`, `include`, `service_tier`. `text.format` asks
for JSON (`serving.output_format`). Images and files in a user's message are a 400 naming them
(this server reads text only); in a tool's output they are a note that they were left out.
PFlash's own fields and `seed` ride at the top level (the SDK's `extra_body`) and are
validated by the chat request.
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

from pflash.serving.output_format import FlatJSONSchemaFormat, ResponsesText
from pflash.serving.validation import FieldNames

_CONFIG = ConfigDict(strict=True, extra="ignore")


class TextPart(BaseModel):
    """Text the client or, in earlier output replayed as input, the model wrote."""

    model_config = _CONFIG

    type: Literal["input_text", "output_text"]
    text: str


class BinaryPart(BaseModel):
    """An image or file in a tool's output: not readable here, noted as left out."""

    model_config = _CONFIG

    type: Literal["input_image", "input_file"]


OutputPart = Annotated[TextPart | BinaryPart, Field(discriminator="type")]


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
    """A call the model made earlier, replayed by the client (`namespace`: the namespace
    tool the function belongs to)."""

    model_config = _CONFIG

    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    namespace: str | None = None
    arguments: str


class FunctionCallOutputItem(BaseModel):
    model_config = _CONFIG

    type: Literal["function_call_output", "custom_tool_call_output"]
    call_id: str = Field(min_length=1)
    output: list[OutputPart]

    output_as_parts = field_validator("output", mode="before")(_as_parts)


class CustomToolCallItem(BaseModel):
    """A call of a custom (free-text) tool the model made earlier."""

    model_config = _CONFIG

    type: Literal["custom_tool_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: str


class ReasoningItem(BaseModel):
    """The model's earlier reasoning (a summary, encrypted content): dropped."""

    model_config = ConfigDict(strict=True, extra="ignore")

    type: Literal["reasoning"]


def _item_kind(v: Any) -> str | None:
    """The item's `type`; a message may leave it out (the SDK's "easy" input message)."""
    if isinstance(v, dict):
        return v.get("type", "message")
    return getattr(v, "type", None)


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[CustomToolCallItem, Tag("custom_tool_call")]
    | Annotated[FunctionCallOutputItem, Tag("custom_tool_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_kind),
]


class FunctionTool(BaseModel):
    model_config = _CONFIG

    type: Literal["function"]
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class CustomToolFormat(BaseModel):
    """A custom tool's input: free text, or text in a grammar (`syntax` lark or regex)."""

    model_config = _CONFIG

    type: Literal["text", "grammar"]
    syntax: str | None = None
    definition: str | None = None


class CustomTool(BaseModel):
    """A tool whose input is free text (Codex's `apply_patch` in its freeform shape)."""

    model_config = _CONFIG

    type: Literal["custom"]
    name: str = Field(min_length=1)
    description: str | None = None
    format: CustomToolFormat | None = None


class NamespaceTool(BaseModel):
    """Functions grouped under a name (Codex's `multi_agent_v1`): the model calls each by
    its own name within the namespace, and the call names both."""

    model_config = _CONFIG

    type: Literal["namespace"]
    name: str = Field(min_length=1)
    description: str | None = None
    tools: list[Annotated[FunctionTool | CustomTool, Field(discriminator="type")]]


class HostedTool(BaseModel):
    """A tool OpenAI runs on its servers (`web_search`, `file_search`, `code_interpreter`,
    `image_generation`, `mcp`, ...): accepted, not offered to the model."""

    model_config = ConfigDict(strict=True, extra="ignore")

    type: str = Field(min_length=1)


def _tool_kind(v: Any) -> str:
    kind = v.get("type") if isinstance(v, dict) else getattr(v, "type", None)
    return kind if kind in ("function", "custom", "namespace") else "hosted"


ToolSpec = Annotated[
    Annotated[FunctionTool, Tag("function")]
    | Annotated[CustomTool, Tag("custom")]
    | Annotated[NamespaceTool, Tag("namespace")]
    | Annotated[HostedTool, Tag("hosted")],
    Discriminator(_tool_kind),
]


class FunctionChoice(BaseModel):
    """`tool_choice: {"type": "function" | "custom", "name": ...}`."""

    model_config = _CONFIG

    type: Literal["function", "custom"]
    name: str = Field(min_length=1)


class AllowedToolsChoice(BaseModel):
    """`tool_choice: {"type": "allowed_tools", "mode", "tools"}`: the model may call only
    these (`mode` auto) or must call one of them (`required`)."""

    model_config = _CONFIG

    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[dict[str, Any]]


class InputTokensRequest(BaseModel):
    """`POST /v1/responses/input_tokens`: the conversation of a Responses request, without
    what only generation reads. Extra top-level fields are kept (`model_extra`) so the
    PFlash ones reach the chat request; the rest are ignored there."""

    model_config = ConfigDict(strict=True, extra="allow")

    model: str | None = None
    input: list[InputItem]
    instructions: str | None = None
    tools: list[ToolSpec] | None = None
    tool_choice: (
        Literal["none", "auto", "required"] | FunctionChoice | AllowedToolsChoice | None
    ) = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None
    conversation: Any = None
    prompt_cache_key: str | None = None

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
    background: bool | None = None
    metadata: dict[str, Any] | None = None
    text: ResponsesText | None = None

    @field_validator("background")
    @classmethod
    def _not_in_background(cls, v: bool | None) -> bool | None:
        if v:
            raise ValueError(
                "this server is stateless and keeps no responses to poll: send the request "
                "without background"
            )
        return v


NAMES = FieldNames.of(
    (ResponsesRequest, MessageItem, TextPart, BinaryPart, FunctionCallItem,
     FunctionCallOutputItem, CustomToolCallItem, ReasoningItem, FunctionTool, CustomTool,
     CustomToolFormat, NamespaceTool, HostedTool, FunctionChoice, AllowedToolsChoice,
     ResponsesText, FlatJSONSchemaFormat),
    tags=frozenset({"message", "function_call", "function_call_output", "custom_tool_call",
                    "custom_tool_call_output", "reasoning", "function", "custom", "namespace",
                    "hosted", "input_text", "output_text", "input_image", "input_file"}),
)  # fmt: skip
