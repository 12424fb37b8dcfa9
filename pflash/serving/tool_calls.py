"""Tool calls in a model's text, as OpenAI's `tool_calls`: the hermes format.

Why here: the target is asked with token ids (in process, or at an upstream's
`/v1/completions`, so token boundaries stay exact), which means no engine parses the
model's output for us. Models trained for tools (Qwen2.5/Qwen3, Hermes, SmolLM3 and any
model prompted with the format) write a call as

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

which vLLM's `hermes` parser reads. We read the same: every complete block whose JSON
names a declared function becomes a call; anything else (text around the blocks, a block
with broken JSON, an undeclared name, a block cut off by `max_tokens`) stays content, so
nothing the model wrote is lost or invented.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def _call(payload: str, names: frozenset[str]) -> dict[str, Any] | None:
    """One block's JSON as an OpenAI tool call, or None when it is not a call to `names`."""
    try:
        obj = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        arguments = args
    elif isinstance(args, dict):
        arguments = json.dumps(args, ensure_ascii=False)
    else:
        return None
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": obj["name"], "arguments": arguments},
    }


def _blocks(text: str) -> Iterator[tuple[int, int, str]]:
    """(start, end, payload) of each complete block, in order: an opening tag, the first
    closing tag after it, and the stripped text between. A scan with `str.find`, so it
    is linear in `text`: model output is untrusted, and a backtracking regex is cubic on an
    opening tag followed by whitespace and no closing tag."""
    pos = 0
    while (start := text.find(OPEN, pos)) >= 0:
        inner = start + len(OPEN)
        close = text.find(CLOSE, inner)
        if close < 0:
            return  # cut off: no later opening tag can close either
        pos = close + len(CLOSE)
        yield start, pos, text[inner:close].strip()


def split_tool_calls(text: str, names: frozenset[str]) -> tuple[str, list[dict[str, Any]]]:
    """(content, calls): the calls in `text` to functions in `names`, and the rest of the
    text with those blocks removed (stripped; "" when only calls were written)."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    end = 0
    if not names:
        return text, []
    for start, stop, payload in _blocks(text):
        call = _call(payload, names)
        if call is None:
            continue
        kept.append(text[end:start])
        calls.append(call)
        end = stop
    if not calls:
        return text, []
    kept.append(text[end:])
    return "".join(kept).strip(), calls


def tool_finish(reason: str, calls: list[dict[str, Any]]) -> str:
    """The finish reason of an answer that made `calls`: "tool_calls" when it stopped on its
    own after calling (a cut-off answer stays "length")."""
    return "tool_calls" if calls and reason == "stop" else reason


def with_index(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Calls as streamed deltas: each carries its `index` in the message."""
    return [{"index": i, **c} for i, c in enumerate(calls)]


@dataclass
class ToolCallStream:
    """Streams text while holding back what may be a tool call.

    `feed(delta)` returns the text that can be sent now: everything before the first
    `<tool_call>` (or before a tail that could still become one). From the first opening
    tag on, text is held; `finish()` splits it into content and calls. Linear in the
    answer: before the tag only the few held characters are searched again, after it the
    deltas are collected as parts and joined once (a string grown with `+=` would be
    copied on every delta)."""

    names: frozenset[str]
    _held: str = ""
    _parts: list[str] = field(default_factory=list)  # from the first opening tag on

    def feed(self, delta: str) -> str:
        if self._parts:
            self._parts.append(delta)
            return ""
        text = self._held + delta
        at = text.find(OPEN)
        if at >= 0:
            self._held = ""
            self._parts.append(text[at:])
            return text[:at]
        keep = _partial_open(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """(text still to send, calls). The text is what the held part keeps as content."""
        held = self._held + "".join(self._parts)
        self._held, self._parts = "", []
        if not held:
            return "", []
        content, calls = split_tool_calls(held, self.names)
        if not calls:
            return held, []
        # content before the first block was sent already; what remains is the text
        # between and after blocks
        return content, calls


def _partial_open(text: str) -> int:
    """Length of the longest tail of `text` that is a proper prefix of `<tool_call>`."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-n:]):
            return n
    return 0
