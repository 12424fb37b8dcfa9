"""Did an agent client's instructions reach the model? A measure read off the client's own
request, independent of how PFlash decides what to pin.

An agent client's instructions: the system prompt, developer messages and mid-conversation
system turns, the instruction blocks it writes into user turns (Claude Code's
`<system-reminder>`, Codex's `<environment_context>` and `<user_instructions>`, ...), and
every tool it declares. Of the text, each line of at least `MIN_LINE_CHARS` characters
(shorter lines are headings and punctuation, found anywhere) must be in the served prompt
verbatim; of each tool, its name, each description line of that length, and its parameter
schema as JSON (as PFlash's tool block writes it for a template that cannot render tools).

`instruction_lines` and `tool_schemas` read a Messages or Responses body; `missing` lists
what a served prompt lacks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

MIN_LINE_CHARS = 30
BLOCK_TAGS = (
    "system-reminder",
    "environment_context",
    "user_instructions",
    "INSTRUCTIONS",
    "skills_instructions",
    "permissions instructions",
)
_BLOCK = re.compile(
    r"<(" + "|".join(re.escape(t) for t in BLOCK_TAGS) + r")(?:\s[^<>]*)?>.*?</\1>", re.DOTALL
)


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    out = []
    for part in content or ():
        if isinstance(part, Mapping) and isinstance(part.get("text"), str):
            out.append(part["text"])
    return out


def _lines(texts: Iterable[str]) -> list[str]:
    return [
        line.strip()
        for text in texts
        for line in text.splitlines()
        if len(line.strip()) >= MIN_LINE_CHARS
    ]


def instruction_texts(body: Mapping[str, Any]) -> list[str]:
    """The instruction texts of a Messages or a Responses request body."""
    texts: list[str] = []
    if "messages" in body:  # Anthropic Messages
        texts += _texts(body.get("system"))
        for message in body["messages"]:
            parts = _texts(message.get("content"))
            if message.get("role") == "system":
                texts += parts
            elif message.get("role") == "user":
                texts += [m.group(0) for part in parts for m in _BLOCK.finditer(part)]
    else:  # OpenAI Responses
        texts += _texts(body.get("instructions"))
        for item in body.get("input") or ():
            if not isinstance(item, Mapping) or item.get("type", "message") != "message":
                continue
            parts = _texts(item.get("content"))
            if item.get("role") in ("system", "developer"):
                texts += parts
            elif item.get("role") == "user":
                texts += [m.group(0) for part in parts for m in _BLOCK.finditer(part)]
    return texts


def instruction_lines(body: Mapping[str, Any]) -> list[str]:
    """Every instruction line of at least `MIN_LINE_CHARS` characters."""
    return _lines(instruction_texts(body))


def tool_schemas(body: Mapping[str, Any]) -> list[str]:
    """What of each declared function must be served: its name, its description's long
    lines, its parameters as JSON (a definition is served as JSON, so a line is looked for
    as JSON writes it: quotes escaped). Hosted tools (no schema) are not offered to the
    model."""
    out: list[str] = []

    def add(name: str, description: str | None, schema: Any) -> None:
        out.append(name)
        out.extend(
            json.dumps(line, ensure_ascii=False)[1:-1] for line in _lines([description or ""])
        )
        if schema:
            out.append(json.dumps(schema, ensure_ascii=False))

    for tool in body.get("tools") or ():
        if "input_schema" in tool:  # Messages
            add(tool["name"], tool.get("description"), tool["input_schema"])
        elif tool.get("type") == "function":
            add(tool["name"], tool.get("description"), tool.get("parameters"))
        elif tool.get("type") == "namespace":
            for inner in tool.get("tools") or ():
                if inner.get("type") == "function":
                    add(inner["name"], inner.get("description"), inner.get("parameters"))
    return out


def missing(served_text: str, pieces: Iterable[str]) -> list[str]:
    """The pieces not found verbatim in `served_text`."""
    return [p for p in pieces if p not in served_text]
