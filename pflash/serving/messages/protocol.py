"""The Anthropic Messages API (`POST /v1/messages`, and `POST /v1/messages/count_tokens` for
its conversation alone): the request as its SDK, and Claude Code, send it.

Types are strict like the chat request's ("5" is not an integer). Fields this server does
not act on are accepted and ignored: `cache_control` on any block or tool, `top_k` (the
targets sample by temperature and top-p only), `service_tier`, `thinking` (adaptive,
enabled or disabled: the targets think as their template and weights make them),
`context_management`, `citations`, `output_config.effort`, the betas a client announces in
its `anthropic-beta` header. `metadata.user_id` names the client's session when it carries
one (`session_of`). A `system` message inside `messages` (Claude Code's mid-conversation
system turns) is a system message at that place. Earlier `thinking` and `redacted_thinking`
blocks are the model's own and are dropped. A tool result's images and binary documents
stand as a note that they were left out (an agent that read a picture keeps working); in a
user's own message they are a 400 naming the block, as the server reads text only.
Anthropic's server tools (`web_search_20250305`, ...) run on Anthropic's servers: they are
not offered to the model and the response says so (`x-pflash-tools-not-offered`).
`output_config.format` (or the beta's `output_format`) asks for JSON matching a schema
(`serving.output_format`). PFlash's own fields (`pflash_mode`, `pflash_keep_ratio`,
`pflash_query`, `pflash_required`, `pflash_return_prompt`, `session_id`) and `seed` ride at
the top level (the SDK's `extra_body`) and are validated by the chat request.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from pflash.serving.output_format import MessagesJSONFormat, MessagesOutputConfig
from pflash.serving.validation import FieldNames

_CONFIG = ConfigDict(strict=True, extra="ignore")


class TextBlock(BaseModel):
    model_config = _CONFIG

    type: Literal["text"]
    text: str


class ThinkingBlock(BaseModel):
    """The model's earlier reasoning, replayed by the client; dropped (`thinking` or
    `redacted_thinking`: this server's targets read no signed or encrypted thoughts)."""

    model_config = _CONFIG

    type: Literal["thinking", "redacted_thinking"]


class DocumentBlock(BaseModel):
    """A document: a plain-text one is read as text; another source (a PDF, an image, a
    file id) is content this server cannot read."""

    model_config = ConfigDict(strict=True, extra="ignore")

    type: Literal["document"]
    source: dict[str, Any]
    title: str | None = None

    def text(self) -> str | None:
        if self.source.get("type") == "text" and isinstance(self.source.get("data"), str):
            return self.source["data"]
        return None


class ImageBlock(BaseModel):
    model_config = _CONFIG

    type: Literal["image"]


class ToolUseBlock(BaseModel):
    model_config = _CONFIG

    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]


def _as_blocks(v: Any) -> Any:
    """Content given as a string is one text block: one shape for the translation to read."""
    return [{"type": "text", "text": v}] if isinstance(v, str) else v


ResultPart = Annotated[TextBlock | ImageBlock | DocumentBlock, Field(discriminator="type")]


class ToolResultBlock(BaseModel):
    """A tool's output; `content` a string or text, image and document blocks (absent: an
    empty output)."""

    model_config = _CONFIG

    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: list[ResultPart] = []
    is_error: bool = False

    content_as_blocks = field_validator("content", mode="before")(_as_blocks)


ContentBlock = Annotated[
    TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | DocumentBlock,
    Field(discriminator="type"),
]


class InputMessage(BaseModel):
    model_config = _CONFIG

    role: Literal["user", "assistant", "system"]
    content: list[ContentBlock]

    content_as_blocks = field_validator("content", mode="before")(_as_blocks)


class ToolDefinition(BaseModel):
    """A client tool (`type` absent or `custom`), with its input schema."""

    model_config = _CONFIG

    type: Literal["custom"] | None = None
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any]


class ServerTool(BaseModel):
    """One of Anthropic's own tools (`web_search_20250305`, `code_execution_...`,
    `bash_20250124`, ...), named by a versioned `type` and defined by Anthropic, not by a
    schema in the request. This server cannot run them nor describe them to its model: they
    are accepted and not offered."""

    model_config = ConfigDict(strict=True, extra="ignore")

    type: str = Field(pattern=r"^[a-z][a-z0-9_]*_\d{8}$")
    name: str = Field(min_length=1)


def _tool_kind(v: Any) -> str:
    if isinstance(v, dict) and v.get("type") not in (None, "custom"):
        return "server"
    return "custom"


Tool = Annotated[
    Annotated[ToolDefinition, Tag("custom")] | Annotated[ServerTool, Tag("server")],
    Discriminator(_tool_kind),
]


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
    tools: list[Tool] | None = None
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
     ServerTool, ThinkingBlock, DocumentBlock, ImageBlock, ToolChoice, MessagesOutputConfig,
     MessagesJSONFormat),
    tags=frozenset({"text", "tool_use", "tool_result", "thinking", "redacted_thinking",
                    "document", "image", "custom", "server"}),
)  # fmt: skip
