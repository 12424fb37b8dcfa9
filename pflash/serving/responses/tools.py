"""The Responses request's tools as the chat flow offers them, and a chat call back as the
item its tool's kind answers with.

A function tool is a chat function as it is; a namespace's functions are offered as
`<namespace>__<name>`; a custom tool (free-text input, optionally in a grammar) as a function
of one string `input`, its grammar in its description; hosted tools are not offered
(`ToolTable.not_offered`). A call comes back as a `function_call` item (with its
`namespace`: the names the client declared) or a `custom_tool_call` item with the `input`
text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pflash.errors import InvalidRequest
from pflash.serving.responses.protocol import (
    CustomTool,
    FunctionTool,
    HostedTool,
    InputTokensRequest,
    NamespaceTool,
)

# a namespaced function's name as the model sees it: <namespace>__<name>
NAMESPACE_SEPARATOR = "__"
CUSTOM_INPUT = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The tool's whole input."}},
    "required": ["input"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class ToolRef:
    """What a chat function stands for in the client's terms: a `function` (in
    `namespace`, or none) or a `custom` tool, called `name`."""

    kind: str
    name: str
    namespace: str | None = None


@dataclass(frozen=True)
class ToolTable:
    """The request's tools as the chat flow offers them: `functions` (chat tool
    definitions), `refs` (each chat function's name → what the client declared), and
    `not_offered` (the hosted tools' types)."""

    functions: tuple[dict[str, Any], ...] = ()
    refs: Mapping[str, ToolRef] = field(default_factory=dict)
    not_offered: tuple[str, ...] = ()

    def ref(self, chat_name: str) -> ToolRef:
        return self.refs.get(chat_name) or ToolRef("function", chat_name)


def _function(name: str, tool: FunctionTool | CustomTool, context: str | None) -> dict:
    """A client tool as a chat function definition named `name`; `context`: the namespace's
    description, which precedes the tool's own."""
    if isinstance(tool, FunctionTool):
        spec = tool.model_dump(exclude={"type", "name"}, exclude_none=True)
    else:
        spec = {"parameters": CUSTOM_INPUT}
        if tool.description is not None:
            spec["description"] = tool.description
        fmt = tool.format
        if fmt is not None and fmt.type == "grammar" and fmt.definition:
            grammar = f"Write `input` in this {fmt.syntax or 'grammar'} grammar:\n{fmt.definition}"
            spec["description"] = "\n\n".join(filter(None, [spec.get("description"), grammar]))
    if context:
        spec["description"] = "\n\n".join(filter(None, [context, spec.get("description")]))
    return {"name": name, **spec}


def tool_table(req: InputTokensRequest) -> ToolTable:
    """The request's tools flattened for the chat flow (see the module docstring); two
    tools that would share a chat name are a 400."""
    functions: list[dict[str, Any]] = []
    refs: dict[str, ToolRef] = {}
    not_offered: list[str] = []

    def add(name: str, tool: FunctionTool | CustomTool, namespace: str | None, context) -> None:
        if name in refs:
            raise InvalidRequest(
                f"tools: two tools are named {name!r} (a namespace's functions are offered "
                f"as <namespace>{NAMESPACE_SEPARATOR}<name>)",
                param="tools",
                code="invalid_value",
            )
        refs[name] = ToolRef(tool.type, tool.name, namespace)
        functions.append(_function(name, tool, context))

    for tool in req.tools or ():
        if isinstance(tool, HostedTool):
            not_offered.append(tool.type)
        elif isinstance(tool, NamespaceTool):
            for inner in tool.tools:
                qualified = f"{tool.name}{NAMESPACE_SEPARATOR}{inner.name}"
                add(qualified, inner, tool.name, tool.description)
        else:
            add(tool.name, tool, None, None)
    return ToolTable(tuple(functions), refs, tuple(not_offered))


def chat_name(name: str, namespace: str | None) -> str:
    return f"{namespace}{NAMESPACE_SEPARATOR}{name}" if namespace else name


def custom_input(arguments: str) -> str:
    """A custom tool's `input` from the chat call's arguments: the `input` string the model
    wrote, or the arguments whole when they are not that object."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get("input"), str):
        return value["input"]
    return arguments


def call_item(
    call: dict[str, Any], status: str, table: ToolTable, arguments: str | None = None
) -> dict[str, Any]:
    """A chat tool call as the item its tool's kind answers with (`call_id` is the chat
    call's id): a `function_call` (with `namespace` for a namespaced function) or a
    `custom_tool_call` with the `input` text. `arguments` overrides the call's (the empty
    start of a streamed item)."""
    function = call["function"]
    ref = table.ref(function["name"])
    suffix = call["id"].split("_", 1)[-1]
    whole = function["arguments"] if arguments is None else arguments
    if ref.kind == "custom":
        return {
            "type": "custom_tool_call",
            "id": "ctc_" + suffix,
            "call_id": call["id"],
            "name": ref.name,
            "input": custom_input(whole) if arguments is None else arguments,
            "status": status,
        }
    item = {
        "type": "function_call",
        "id": "fc_" + suffix,
        "call_id": call["id"],
        "name": ref.name,
        "arguments": whole,
        "status": status,
    }
    if ref.namespace is not None:
        item["namespace"] = ref.namespace
    return item
