"""Tools for a chat template that cannot render them.

An agent's tools reach the model through the target's chat template (`tools=`). Some
templates ignore them (SmolLM2's, many base-model and older chat templates), and rendering
the chat as given would then serve a prompt without a single tool schema, silently: the
model cannot call what it was never shown. For such a template the tools are written into
the prompt by PFlash, in the format its tool-call reader expects (`serving.tool_calls`: hermes
`<tool_call>` blocks, as Qwen2.5/Qwen3 and Hermes models are trained on):

- a system block listing every function's definition as JSON inside `<tools></tools>` and
  saying how to call them, appended to the first system message (or as the first message
  when there is none);
- the calls an earlier assistant turn made, as `<tool_call>` blocks after its text, when
  the template does not render `tool_calls` either (the model must see what it called to
  read the results that follow).

Whether a template renders tools, or tool calls, is asked once per template by rendering a
small probe chat with and without them (`template_support`). The `<tools>` block is an
instruction block (`config.instruction_tags`), so it is kept verbatim like the system prompt.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TOOLS_HEADER = (
    "# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_FOOTER = (
    "\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
_PROBE_NAME = "pflash_probe_function_5e1f"
_PROBE_TOOL = {
    "type": "function",
    "function": {"name": _PROBE_NAME, "description": _PROBE_NAME, "parameters": {}},
}


@dataclass(frozen=True)
class TemplateSupport:
    """What a chat template renders of an agent's chat: the tool definitions (`tools`) and
    the calls of earlier assistant turns (`tool_calls`)."""

    tools: bool
    tool_calls: bool


_SUPPORT: dict[str, TemplateSupport] = {}


def template_support(render: Callable[..., str], template_key: str) -> TemplateSupport:
    """Whether the template behind `render(messages, tools)` (a function returning the
    rendered text; a template that raises counts as rendering nothing) shows tools and tool
    calls, asked once per `template_key` (the template's text)."""
    cached = _SUPPORT.get(template_key)
    if cached is not None:
        return cached
    user = {"role": "user", "content": "hi"}
    call = {"id": "c1", "type": "function", "function": {"name": _PROBE_NAME, "arguments": "{}"}}
    turns = [
        user,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "user", "content": "thanks"},
    ]
    support = TemplateSupport(
        tools=_PROBE_NAME in _rendered(render, [user], [_PROBE_TOOL]),
        tool_calls=_PROBE_NAME in _rendered(render, turns, None),
    )
    _SUPPORT[template_key] = support
    return support


def _rendered(render: Callable[..., str], messages: list[dict], tools: list[dict] | None) -> str:
    try:
        return render(messages, tools)
    except Exception:  # a template that rejects the probe renders none of it
        return ""


def tools_block(tools: Sequence[Mapping[str, Any]]) -> str:
    """The system block that shows `tools` (chat tool definitions) to the model: each as
    one line of JSON between `<tools>` tags, then how to call them."""
    lines = "\n".join(json.dumps(dict(t), ensure_ascii=False) for t in tools)
    return TOOLS_HEADER + lines + TOOLS_FOOTER


def call_text(call: Mapping[str, Any]) -> str:
    """One earlier call as the model writes it: a `<tool_call>` block (arguments as an
    object when they are JSON, else as the string they are)."""
    function = call.get("function") or {}
    arguments: Any = function.get("arguments", "")
    try:
        arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        pass
    payload = {"name": function.get("name"), "arguments": arguments}
    return "<tool_call>\n" + json.dumps(payload, ensure_ascii=False) + "\n</tool_call>"


def tools_in_text(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    support: TemplateSupport,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) to render with a template of `support`: unchanged where it renders
    them; otherwise the tools as a system block (`tools_block`) and None, and earlier calls
    as `<tool_call>` blocks in their assistant turns."""
    out = [dict(m) for m in messages]
    if tools and not support.tools:
        block = tools_block(tools)
        if out and out[0].get("role") == "system" and isinstance(out[0].get("content"), str):
            content = out[0]["content"]
            out[0]["content"] = f"{content}\n\n{block}" if content.strip() else block
        else:
            out.insert(0, {"role": "system", "content": block})
        tools = None
    if not support.tool_calls:
        for m in out:
            calls = m.get("tool_calls")
            if m.get("role") == "assistant" and calls:
                texts = [m.get("content") or "", *(call_text(c) for c in calls)]
                m["content"] = "\n".join(t for t in texts if t)
                del m["tool_calls"]
    return out, list(tools) if tools else None
