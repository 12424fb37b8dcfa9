"""`POST /v1/chat/completions`: the request (messages, tools, tool choice, on top of the
shared generation fields) and the response, whole (`ChatCompletionResponse`) and streamed
(`ChatCompletionChunk`).

Message roles follow OpenAI's rules (`ChatMessage`); a message's content parts are read by
the one rule for them (`pflash.message_content`). `tools` and `tool_choice` decide which
hermes-format calls in the answer become `tool_calls` (`serving.tool_calls`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from pflash.errors import InvalidRequest
from pflash.message_content import content_text
from pflash.models.target.protocol import FinishReason
from pflash.serving.protocol import REQUEST_CONFIG, GenerationRequest, absent
from pflash.serving.usage import Usage

Role = Literal["system", "developer", "user", "assistant", "tool"]

# ---------------------------------------------------------------------- request


class FunctionCall(BaseModel):
    model_config = REQUEST_CONFIG

    name: str
    arguments: str


class ToolCall(BaseModel):
    model_config = REQUEST_CONFIG

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDefinition(BaseModel):
    model_config = REQUEST_CONFIG

    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    model_config = REQUEST_CONFIG

    type: Literal["function"]
    function: FunctionDefinition


class _ToolName(BaseModel):
    model_config = REQUEST_CONFIG

    name: str


class NamedToolChoice(BaseModel):
    """`tool_choice: {"type": "function", "function": {"name": ...}}`."""

    model_config = REQUEST_CONFIG

    type: Literal["function"]
    function: _ToolName


class ChatMessage(BaseModel):
    """One chat message. `content` is normalised to a string: text parts join with "\\n".

    Role rules (OpenAI's): system/developer/user/tool messages need content; a tool
    message needs `tool_call_id`; only assistant messages carry `tool_calls`, and an
    assistant message needs content or tool calls.
    """

    model_config = REQUEST_CONFIG

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


class ChatCompletionRequest(GenerationRequest):
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


# ---------------------------------------------------------------------- response


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[dict[str, Any]] | None = Field(None, exclude_if=absent)


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
    pflash_prompt: str | None = Field(None, exclude_if=absent)


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = Field(None, exclude_if=absent)
    content: str | None = Field(None, exclude_if=absent)
    tool_calls: list[dict[str, Any]] | None = Field(None, exclude_if=absent)


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
    usage: Usage | None = Field(None, exclude_if=absent)
    pflash_prompt: str | None = Field(None, exclude_if=absent)
