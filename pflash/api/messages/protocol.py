"""The Anthropic Messages API (`POST /v1/messages`, and `POST /v1/messages/count_tokens` for
its conversation alone): the request as its SDK sends it.

Types are strict like the chat request's ("5" is not an integer). Fields this server does
not act on are accepted and ignored: `cache_control` on any block or tool, `metadata`,
`top_k` (the targets sample by temperature and top-p only), `service_tier`, `thinking`,
`citations`, `output_config.effort`. `output_config.format` (or the beta's `output_format`)
asks for JSON matching a schema (`api.output_format`). Content kinds it cannot serve
(`image`, `document`, `thinking`, server tools) are a 400 naming the block. PFlash's own fields (`pflash_mode`, `pflash_keep_ratio`,
`pflash_query`, `pflash_required`, `pflash_return_prompt`, `session_id`) and `seed` ride at
the top level (the SDK's `extra_body`) and are validated by the chat request.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pflash.api.edge import FieldNames
from pflash.api.output_format import MessagesJSONFormat, MessagesOutputConfig

_CONFIG = ConfigDict(strict=True, extra="ignore")


class TextBlock(BaseModel):
    model_config = _CONFIG

    type: Literal["text"]
    text: str


class ToolUseBlock(BaseModel):
    model_config = _CONFIG

    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]


def _as_blocks(v: Any) -> Any:
    """Content given as a string is one text block: one shape for the translation to read."""
    return [{"type": "text", "text": v}] if isinstance(v, str) else v


class ToolResultBlock(BaseModel):
    """A tool's output; `content` a string or text blocks (absent: an empty output)."""

    model_config = _CONFIG

    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: list[TextBlock] = []
    is_error: bool = False

    content_as_blocks = field_validator("content", mode="before")(_as_blocks)


ContentBlock = Annotated[TextBlock | ToolUseBlock | ToolResultBlock, Field(discriminator="type")]


class InputMessage(BaseModel):
    model_config = _CONFIG

    role: Literal["user", "assistant"]
    content: list[ContentBlock]

    content_as_blocks = field_validator("content", mode="before")(_as_blocks)


class ToolDefinition(BaseModel):
    """A client tool. Anthropic's own tools (`bash_...`, `web_search_...`) run on their
    servers and are not served here."""

    model_config = _CONFIG

    type: Literal["custom"] | None = None
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any]


class ToolChoice(BaseModel):
    model_config = _CONFIG

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class CountTokensRequest(BaseModel):
    """`POST /v1/messages/count_tokens`: the conversation of a Messages request, without
    what only generation reads. Extra top-level fields are kept (`model_extra`) so the
    PFlash ones reach the chat request; the rest are ignored there."""

    model_config = ConfigDict(strict=True, extra="allow")

    model: str
    messages: list[InputMessage]
    system: list[TextBlock] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None

    system_as_blocks = field_validator("system", mode="before")(_as_blocks)

    @field_validator("messages")
    @classmethod
    def _messages_not_empty(cls, v: list[InputMessage]) -> list[InputMessage]:
        if not v:
            raise ValueError("messages must not be empty")
        return v


class MessagesRequest(CountTokensRequest):
    """`POST /v1/messages`: the conversation and how to generate the answer."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    metadata: dict[str, Any] | None = None
    output_config: MessagesOutputConfig | None = None
    # the structured-outputs beta's name for output_config.format
    output_format: MessagesJSONFormat | None = None

    @model_validator(mode="after")
    def _one_output_format(self) -> MessagesRequest:
        if self.output_format is not None and self.output_config and self.output_config.format:
            raise ValueError("give the output format once: output_config.format or output_format")
        return self


NAMES = FieldNames.of(
    (MessagesRequest, InputMessage, TextBlock, ToolUseBlock, ToolResultBlock, ToolDefinition,
     ToolChoice, MessagesOutputConfig, MessagesJSONFormat),
    tags=frozenset({"text", "tool_use", "tool_result"}),
)  # fmt: skip
