"""Structured output: the JSON formats the three APIs name (Chat Completions'
`response_format`, Responses' `text.format`, Messages' `output_config.format`) read as the
one `OutputFormat` a target is asked for; an edge API puts its format on the chat request as
that value's `response_format()`.

A format constrains decoding: vLLM behind the `openai` and `ray_llm` backends compiles the
schema into a grammar, and the in-process transformers target masks its sampler with one
(`models/target/constrained.py`). A backend that could not would have to refuse it (a 400
naming the API's field) rather than answer free text a client fails to parse later.
Compression does not change: the format shapes the answer, not which context is kept.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pflash.models.target.protocol import OutputFormat

# a schema is compiled into a grammar per request by the upstream: bounded like other text
# the server hands on (the body limit alone allows megabytes)
MAX_SCHEMA_CHARS = 65_536
# OpenAI's rule for a format's name, which vLLM and the SDKs follow
SCHEMA_NAME = r"^[A-Za-z0-9_-]{1,64}$"

_CONFIG = ConfigDict(strict=True, extra="ignore")


def _bounded_schema(v: dict[str, Any]) -> dict[str, Any]:
    if len(json.dumps(v)) > MAX_SCHEMA_CHARS:
        raise ValueError(f"the schema has more than {MAX_SCHEMA_CHARS} characters as JSON")
    return v


class TextFormat(BaseModel):
    model_config = _CONFIG

    type: Literal["text"]


class JSONObjectFormat(BaseModel):
    model_config = _CONFIG

    type: Literal["json_object"]


class JSONSchemaSpec(BaseModel):
    """Chat Completions' `json_schema` object."""

    model_config = _CONFIG

    name: str = Field(pattern=SCHEMA_NAME)
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None
    description: str | None = None

    bounded = field_validator("schema_")(_bounded_schema)


class JSONSchemaFormat(BaseModel):
    """Chat Completions: `{"type": "json_schema", "json_schema": {name, schema, strict}}`."""

    model_config = _CONFIG

    type: Literal["json_schema"]
    json_schema: JSONSchemaSpec


ResponseFormat = Annotated[
    TextFormat | JSONObjectFormat | JSONSchemaFormat, Field(discriminator="type")
]


class FlatJSONSchemaFormat(BaseModel):
    """Responses: the same fields, flat: `{"type": "json_schema", "name", "schema", ...}`."""

    model_config = _CONFIG

    type: Literal["json_schema"]
    name: str = Field(pattern=SCHEMA_NAME)
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None
    description: str | None = None

    bounded = field_validator("schema_")(_bounded_schema)


TextFormatConfig = Annotated[
    TextFormat | JSONObjectFormat | FlatJSONSchemaFormat, Field(discriminator="type")
]


class ResponsesText(BaseModel):
    """Responses' `text` (`verbosity` is accepted and ignored)."""

    model_config = _CONFIG

    format: TextFormatConfig | None = None


class MessagesJSONFormat(BaseModel):
    """Messages' `output_config.format`: a schema, always strict (Anthropic's rule)."""

    model_config = _CONFIG

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")

    bounded = field_validator("schema_")(_bounded_schema)


class MessagesOutputConfig(BaseModel):
    """Messages' `output_config` (`effort` is accepted and ignored)."""

    model_config = _CONFIG

    format: MessagesJSONFormat | None = None


def output_format(
    fmt: TextFormat | JSONObjectFormat | JSONSchemaFormat | None,
) -> OutputFormat | None:
    """What a chat request's `response_format` asks of the target (None: free text)."""
    if fmt is None or isinstance(fmt, TextFormat):
        return None
    if isinstance(fmt, JSONObjectFormat):
        return OutputFormat("json_object")
    spec = fmt.json_schema
    return OutputFormat("json_schema", json.dumps(spec.schema_), spec.name, spec.strict)


def text_format(text: ResponsesText | None) -> OutputFormat | None:
    """What a Responses request's `text.format` asks of the target (None: free text)."""
    fmt = text.format if text is not None else None
    if fmt is None or isinstance(fmt, TextFormat):
        return None
    if isinstance(fmt, JSONObjectFormat):
        return OutputFormat("json_object")
    return OutputFormat("json_schema", json.dumps(fmt.schema_), fmt.name, fmt.strict)


def echo_text_format(text: ResponsesText | None) -> dict[str, Any]:
    """The `text` a Response reports: the request's format, or plain text."""
    fmt = text.format if text is not None else None
    if fmt is None:
        return {"format": {"type": "text"}}
    return {"format": fmt.model_dump(by_alias=True, exclude_none=True)}


def messages_format(fmt: MessagesJSONFormat | None) -> OutputFormat | None:
    """What a Messages request's format asks of the target (None: free text); Anthropic's
    formats have no name and are always strict."""
    if fmt is None:
        return None
    return OutputFormat("json_schema", json.dumps(fmt.schema_), "output", True)
