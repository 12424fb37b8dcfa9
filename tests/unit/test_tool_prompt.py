"""Tools for a chat template that cannot render them: written into the prompt by PFlash in
the format its tool-call reader expects, never silently dropped."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from pflash.compress.render.chat import render_chat
from pflash.compress.render.rendered import render_chat_prompt
from pflash.compress.render.tool_prompt import call_text, template_support, tools_block
from pflash.serving.tool_calls import split_tool_calls

TEMPLATES = Path(__file__).parents[1] / "fixtures" / "templates"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": 'The weather in a city, "now".',
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
]


def _with_template(tokenizer, name):
    other = copy.copy(tokenizer)
    other.chat_template = (TEMPLATES / f"{name}.jinja").read_text()
    return other


def test_a_template_without_tools_gets_them_as_a_system_block_and_calls_as_text(
    smollm2_tokenizer,
):
    """SmolLM2's template renders neither `tools` nor `tool_calls`: the definitions go into
    the system message as the hermes block, the earlier call into its assistant turn."""
    prompt = render_chat_prompt(smollm2_tokenizer, CHAT, tools=[WEATHER])
    assert prompt.tools is None
    assert prompt.messages[0]["content"] == "You are terse.\n\n" + tools_block([WEATHER])
    assert json.dumps(WEATHER, ensure_ascii=False) in prompt.text
    assert "Checking.\n" + call_text(CHAT[2]["tool_calls"][0]) in prompt.text
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt.text
    # without a system message the block is the first message
    bare = render_chat_prompt(smollm2_tokenizer, CHAT[1:], tools=[WEATHER])
    assert bare.messages[0] == {"role": "system", "content": tools_block([WEATHER])}


def test_a_template_that_renders_tools_gets_them_as_they_are(smollm2_tokenizer):
    qwen = _with_template(smollm2_tokenizer, "qwen3")
    support = template_support(lambda m, t: render_chat(qwen, m, tools=t), str(qwen.chat_template))
    assert support.tools and support.tool_calls
    prompt = render_chat_prompt(qwen, CHAT, tools=[WEATHER])
    assert prompt.tools == [WEATHER]
    assert [m["content"] for m in prompt.messages] == [m["content"] for m in CHAT]
    assert prompt.text.count("get_weather") >= 2  # the definition and the call, by Qwen's template


def test_a_call_written_as_the_block_asks_is_read_back_as_a_tool_call():
    """The block tells the model the format the hermes reader reads: a call the model
    writes as shown comes back as `tool_calls` naming the declared function."""
    written = "Let me check.\n" + call_text(CHAT[2]["tool_calls"][0])
    content, calls = split_tool_calls(written, frozenset({"get_weather"}))
    assert content == "Let me check."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert "<tool_call>" in tools_block([WEATHER])


def test_arguments_that_are_not_json_are_written_as_the_string_they_are():
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "not json"}}
    assert call_text(call) == '<tool_call>\n{"name": "f", "arguments": "not json"}\n</tool_call>'
