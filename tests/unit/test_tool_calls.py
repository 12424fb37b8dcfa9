"""Hermes-format tool calls in an answer become OpenAI `tool_calls`; nothing else does."""

from __future__ import annotations

import json

import pytest

from pflash.errors import InvalidRequest
from pflash.serving.chat_completion.serving import parse_chat_request
from pflash.serving.tool_calls import ToolCallStream, split_tool_calls, tool_finish, with_index

NAMES = frozenset({"get_weather", "search"})
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def _fn(call):
    return call["function"]["name"], json.loads(call["function"]["arguments"])


def test_a_call_block_becomes_a_tool_call_and_leaves_no_content():
    content, calls = split_tool_calls(CALL, NAMES)
    assert content == ""
    assert [_fn(c) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")


def test_text_around_calls_stays_content_and_every_call_is_kept_in_order():
    text = f'Let me check.\n{CALL}\n<tool_call>{{"name": "search", "arguments": "{{}}"}}</tool_call> done'
    content, calls = split_tool_calls(text, NAMES)
    assert content == "Let me check.\n\n done"
    assert [c["function"]["name"] for c in calls] == ["get_weather", "search"]
    assert calls[1]["function"]["arguments"] == "{}"  # string arguments pass as they are
    assert calls[0]["id"] != calls[1]["id"]


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>',  # broken JSON
        '<tool_call>{"name": "delete_all", "arguments": {}}</tool_call>',  # undeclared
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Pa',  # cut off by max_tokens
        '<tool_call>["get_weather"]</tool_call>',  # not an object
        '<tool_call>{"name": "get_weather", "arguments": 3}</tool_call>',  # bad arguments
        "The weather in Paris is mild.",
    ],
)
def test_anything_that_is_not_a_complete_call_to_a_declared_function_stays_text(text):
    assert split_tool_calls(text, NAMES) == (text, [])


def test_without_declared_functions_nothing_is_parsed():
    assert split_tool_calls(CALL, frozenset()) == (CALL, [])


def test_the_finish_reason_is_tool_calls_only_for_an_answer_that_stopped_after_calling():
    assert tool_finish("stop", [{"id": "x"}]) == "tool_calls"
    assert tool_finish("length", [{"id": "x"}]) == "length"
    assert tool_finish("stop", []) == "stop"


def _stream(text: str, step: int):
    s = ToolCallStream(NAMES)
    sent = [s.feed(text[i : i + step]) for i in range(0, len(text), step)]
    rest, calls = s.finish()
    return "".join(sent), rest, calls


@pytest.mark.parametrize("step", [1, 3, 7, 1000])
def test_streaming_sends_text_before_a_call_and_holds_the_call_back(step):
    text = "Checking the weather now. " + CALL
    sent, rest, calls = _stream(text, step)
    assert sent == "Checking the weather now. "  # never a piece of the tag
    assert rest == "" and [_fn(c) for c in calls] == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("step", [1, 2, 5])
def test_streaming_releases_text_that_only_looked_like_the_start_of_a_tag(step):
    text = "Use <tool to open it; a <tool_call> without an end is just text"
    sent, rest, calls = _stream(text, step)
    assert calls == [] and sent + rest == text
    assert sent.startswith("Use <tool to open it; a ")


def test_streamed_and_whole_answers_agree_on_the_calls_and_the_content():
    text = f"Sure.\n{CALL}\nAnything else?"
    sent, rest, calls = _stream(text, 4)
    content, whole = split_tool_calls(text, NAMES)
    assert [_fn(c) for c in calls] == [_fn(c) for c in whole]
    assert (sent + rest).replace("\n", "") == content.replace("\n", "")


def test_streamed_calls_carry_their_index():
    _, calls = split_tool_calls(CALL + CALL, NAMES)
    assert [c["index"] for c in with_index(calls)] == [0, 1]


# ----------------------------------------------------------------------------- requests

TOOLS = [
    {"type": "function", "function": {"name": "get_weather"}},
    {"type": "function", "function": {"name": "search"}},
]
USER = {"role": "user", "content": "Weather in Paris?"}


@pytest.mark.parametrize(
    ("choice", "callable_"),
    [
        (None, {"get_weather", "search"}),
        ("auto", {"get_weather", "search"}),
        ("required", {"get_weather", "search"}),
        ("none", set()),
        ({"type": "function", "function": {"name": "search"}}, {"search"}),
    ],
)
def test_tool_choice_decides_which_calls_may_be_read(choice, callable_):
    body = {"messages": [USER], "tools": TOOLS}
    if choice is not None:
        body["tool_choice"] = choice
    assert parse_chat_request(body).callable_tools() == callable_


def test_a_request_without_tools_reads_no_calls():
    assert parse_chat_request({"messages": [USER]}).callable_tools() == frozenset()


@pytest.mark.parametrize(
    "choice",
    [{"type": "function", "function": {"name": "delete_all"}}, "sometimes", 3],
)
def test_a_tool_choice_that_is_not_valid_is_a_400_naming_it(choice):
    with pytest.raises(InvalidRequest) as info:
        parse_chat_request({"messages": [USER], "tools": TOOLS, "tool_choice": choice})
    assert info.value.param == "tool_choice"
