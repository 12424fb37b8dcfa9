"""The Anthropic Messages API as a translation onto the chat flow: requests in, messages and
events out, validated against the official `anthropic` SDK's own types."""

from __future__ import annotations

import asyncio
import json

import anthropic.types
import pytest
from pydantic import TypeAdapter

from pflash.errors import InvalidRequest, ModelNotFound
from pflash.models.target.protocol import GenerationTimings
from pflash.serving.chat_completion.serving import chat_chunk, chat_response, chat_usage_chunk
from pflash.serving.envelope import SSE_KEEPALIVE, StreamError, error_response
from pflash.serving.messages import models
from pflash.serving.messages.translate import COUNT, EDGE, error_body
from pflash.serving.models import listing
from pflash.serving.protocol import ResponseMeta
from pflash.serving.tool_calls import with_index
from pflash.serving.usage import PFlashStats, build_usage

EVENT = TypeAdapter(anthropic.types.RawMessageStreamEvent)
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    "cache_control": {"type": "ephemeral"},
}
CALL = {
    "id": "call_abc",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}


def _request(**fields):
    return {
        "model": "pflash",
        "max_tokens": 32,
        "messages": [{"role": "user", "content": "Hi"}],
        **fields,
    }


def _usage(prompt=120, cached=20, completion=7):
    timings = GenerationTimings(
        prompt_n=prompt - cached,
        prompt_ms=5.0,
        predicted_n=completion,
        predicted_ms=9.0,
        cache_n=cached,
    )
    return build_usage(prompt, timings, PFlashStats(compressed_tokens=60, keep_ratio=0.5))


META = ResponseMeta("chatcmpl-00ff", "pflash", 1_700_000_000)


# ---------------------------------------------------------------------- request in


def test_a_tool_conversation_becomes_chat_messages_in_block_order():
    body = _request(
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18 C"}]},
                    {"type": "text", "text": "And tomorrow?"},
                ],
            },
        ],
        tools=[WEATHER],
    )  # fmt: skip
    chat = EDGE.parse(json.dumps(body)).chat
    assert chat.template_messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C"},
        {"role": "user", "content": "And tomorrow?"},
    ]
    assert chat.template_tools() == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": WEATHER["input_schema"],
            },
        }
    ]


def test_a_count_renders_the_prompt_the_same_messages_request_renders():
    """`count_tokens` takes the conversation without `max_tokens`; what renders (messages,
    tools, the tool choice, PFlash fields) is what the Messages request runs as."""
    conversation = {
        "model": "pflash",
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "18 C"}]},
        ],
        "tools": [WEATHER],
        "tool_choice": {"type": "any"},
        "pflash_mode": "always",
        "thinking": {"type": "enabled", "budget_tokens": 1024},  # accepted, ignored
    }  # fmt: skip
    counted = COUNT.parse(json.dumps(conversation)).chat
    served = EDGE.parse({**conversation, "max_tokens": 64, "temperature": 0.3}).chat
    assert counted.template_messages() == served.template_messages()
    assert counted.template_tools() == served.template_tools()
    assert (counted.tool_choice, counted.pflash_mode) == (served.tool_choice, "always")
    assert (
        anthropic.types.MessageTokensCount.model_validate(COUNT.answer(1234)).input_tokens == 1234
    )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0]"),
        ({"messages": [{"role": "user", "content": "Hi"}], "pflash_mode": "sometimes"}, "pflash_mode"),
        ({"model": "pflash"}, "messages"),
    ],
)  # fmt: skip
def test_a_bad_count_is_a_400_in_anthropics_shape(body, param):
    with pytest.raises(InvalidRequest) as err:
        COUNT.parse({"model": "pflash", **body})
    assert (err.value.http_status, err.value.param) == (400, param)
    shaped = error_body(*error_response(err.value))
    assert shaped["type"] == "error" and shaped["error"]["type"] == "invalid_request_error"


def test_the_served_models_read_as_anthropics_model_list():
    page = models.model_page(["pflash", "local"], max_input=8192, max_output=None)
    parsed = [anthropic.types.ModelInfo.model_validate(m) for m in page["data"]]
    assert [(m.id, m.display_name, m.max_input_tokens, m.max_tokens) for m in parsed] == [
        ("pflash", "pflash", 8192, None),
        ("local", "local", 8192, None),
    ]
    assert (page["has_more"], page["first_id"], page["last_id"]) == (False, "pflash", "local")
    one = models.model_info("pflash", max_input=None, max_output=512)
    assert anthropic.types.ModelInfo.model_validate(one).max_tokens == 512
    assert models.wants_anthropic({"anthropic-version": "2023-06-01"})
    assert not models.wants_anthropic({"authorization": "Bearer k"})


def test_a_model_listing_answers_in_the_shape_its_client_reads():
    limits = {"context": 8192, "max_prompt_tokens": 131072, "max_output_tokens": 4096}
    names = ("pflash", "local")
    claude = {"anthropic-version": "2023-06-01"}
    page = listing(names, None, claude, **limits)
    assert [(m["id"], m["max_input_tokens"], m["max_tokens"]) for m in page["data"]] == [
        ("pflash", 131072, 4096),
        ("local", 131072, 4096),
    ]
    one = listing(names, "local", claude, **{**limits, "max_prompt_tokens": None})
    assert (one["type"], one["max_input_tokens"]) == ("model", 8192)  # no bound: the context
    openai_list = listing(names, None, {}, **limits)
    assert openai_list["object"] == "list"
    assert [(c["id"], c["max_model_len"]) for c in openai_list["data"]] == [
        ("pflash", 8192),
        ("local", 8192),
    ]
    assert listing(names, "pflash", {}, **limits)["object"] == "model"
    for headers in ({}, claude):
        with pytest.raises(ModelNotFound):
            listing(names, "claude-x", headers, **limits)


def test_an_assistant_turn_of_only_tool_use_has_no_content():
    body = _request(
        messages=[
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
        ]
    )  # fmt: skip
    messages = EDGE.parse(body).chat.template_messages()
    assert "content" not in messages[1] and messages[1]["tool_calls"][0]["id"] == "t"
    assert messages[2] == {"role": "tool", "tool_call_id": "t", "content": ""}


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
    ],
)
def test_tool_choice_maps_to_the_chat_choice(choice, expected):
    chat = EDGE.parse(_request(tools=[WEATHER], tool_choice=choice)).chat
    assert chat.tool_choice == expected


def test_tool_choice_of_one_tool_calls_only_that_tool():
    chat = EDGE.parse(
        _request(tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"})
    ).chat
    assert chat.callable_tools() == frozenset({"get_weather"})


def test_sampling_stop_and_pflash_fields_reach_the_chat_request():
    chat = EDGE.parse(
        _request(
            temperature=0.0,
            top_p=0.5,
            top_k=40,
            stop_sequences=["END"],
            metadata={"user_id": "u1"},
            stream=True,
            pflash_mode="always",
            pflash_keep_ratio=0.3,
            pflash_query="the quokka number",
            session_id="s-1",
            seed=7,
        )
    ).chat
    params = chat.sampling_params()
    assert (params.max_tokens, params.temperature, params.top_p, params.stop, params.seed) == (
        32,
        0.0,
        0.5,
        ("END",),
        7,
    )
    assert (chat.pflash_mode, chat.pflash_keep_ratio, chat.pflash_query, chat.session_id) == (
        "always",
        0.3,
        "the quokka number",
        "s-1",
    )
    assert chat.stream and chat.include_usage  # message_delta reports usage


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        (
            _request(messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}]),
            "messages[0].content[0]",
            "'image' is not supported",
        ),
        ({"model": "pflash", "messages": [{"role": "user", "content": "x"}]}, "max_tokens", "required"),
        (_request(max_tokens="5"), "max_tokens", "valid integer"),
        (_request(messages=[]), "messages", "must not be empty"),
        (
            _request(messages=[{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]),
            "messages[0].content[0]",
            "assistant message",
        ),
        (_request(tools=[{"name": "lookup", "description": "no schema"}]), "tools[0].input_schema", "required"),
        (_request(tools=[{"type": "bash", "name": "bash"}]), "tools[0].type", "pattern"),
        (
            _request(messages=[{"role": "user", "content": [{"type": "document", "source": {"type": "base64", "data": "JVBER"}}]}]),
            "messages[0].content[0]",
            "reads text only",
        ),
        (
            _request(messages=[{"role": "system", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]),
            "messages[0].content[0]",
            "user or assistant message",
        ),
        (_request(tool_choice={"type": "tool"}), "tool_choice.name", "name"),
        (_request(pflash_keep_ratio=2), "pflash_keep_ratio", "less than or equal to 1"),
        (_request(pflash_bogus=1), "pflash_bogus", "unknown PFlash field"),
    ],
)  # fmt: skip
def test_bad_input_is_a_400_naming_the_field(body, param, words):
    with pytest.raises(InvalidRequest) as err:
        EDGE.parse(body)
    assert err.value.http_status == 400
    assert err.value.param == param
    assert words in err.value.message


# ---------------------------------------------------------------------- response out


def test_a_tool_call_answer_is_a_tool_use_block_with_parsed_input():
    resp = chat_response(META, "", "tool_calls", _usage(), tool_calls=[CALL])
    body, headers = EDGE.parse(_request()).respond(resp)
    message = anthropic.types.Message.model_validate(body)
    assert message.id == "msg_00ff"
    assert message.stop_reason == "tool_use"
    (block,) = message.content
    assert (block.type, block.id, block.name, block.input) == (
        "tool_use",
        "call_abc",
        "get_weather",
        {"city": "Paris"},
    )
    assert json.loads(headers["x-pflash-stats"])["keep_ratio"] == 0.5


def test_usage_splits_the_original_prompt_into_uncached_and_cached_tokens():
    resp = chat_response(META, "Paris.", "length", _usage(prompt=120, cached=20, completion=7))
    body, _ = EDGE.parse(_request()).respond(resp)
    message = anthropic.types.Message.model_validate(body)
    assert message.stop_reason == "max_tokens"
    assert message.content[0].text == "Paris."
    assert (message.usage.input_tokens, message.usage.cache_read_input_tokens) == (100, 20)
    assert message.usage.output_tokens == 7
    assert body["usage"]["pflash"]["compressed_tokens"] == 60


def test_arguments_that_are_not_an_object_are_kept_whole():
    call = {**CALL, "function": {"name": "get_weather", "arguments": '"Paris"'}}
    body, _ = EDGE.parse(_request()).respond(
        chat_response(META, "", "tool_calls", _usage(), tool_calls=[call])
    )
    assert body["content"][0]["input"] == {"arguments": '"Paris"'}


@pytest.mark.parametrize(
    ("exc", "status", "kind"),
    [
        (InvalidRequest("bad"), 400, "invalid_request_error"),
        (ModelNotFound("gpt", ("pflash",)), 404, "not_found_error"),
        (TimeoutError(), 504, "timeout_error"),
    ],
)
def test_errors_take_anthropics_shape(exc, status, kind):
    code, body = error_response(exc)
    assert code == status
    shaped = error_body(code, body)
    assert shaped == {"type": "error", "error": {"type": kind, "message": body["error"]["message"]}}


# ---------------------------------------------------------------------- stream out


async def _items(*items):
    for item in items:
        yield item


def _events(items) -> list[tuple[str, dict]]:
    async def collect():
        return [frame async for frame in EDGE.parse(_request(stream=True)).stream(_items(*items))]

    out = []
    for frame in asyncio.run(collect()):
        if frame == SSE_KEEPALIVE:
            out.append(("keep-alive", {}))
            continue
        head, data = frame.strip().split("\n")
        name = head.removeprefix("event: ")
        payload = json.loads(data.removeprefix("data: "))
        assert payload["type"] == name
        if name not in ("error", "ping"):  # the SDK skips these two before parsing
            EVENT.validate_python(payload)  # the SDK's own event types
        out.append((name, payload))
    return out


def test_a_streamed_text_answer_follows_the_documented_event_order():
    events = _events(
        [
            SSE_KEEPALIVE,
            chat_chunk(META, role="assistant", content="", pflash_prompt="served"),
            chat_chunk(META, content="Par"),
            chat_chunk(META, content="is."),
            chat_chunk(META, finish_reason="stop"),
            chat_usage_chunk(META, _usage()),
        ]
    )
    assert [name for name, _ in events] == [
        "keep-alive",
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[1][1]["message"]["pflash_prompt"] == "served"
    assert "".join(p["delta"]["text"] for n, p in events if n == "content_block_delta") == "Paris."
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] == "end_turn"
    assert (delta["usage"]["input_tokens"], delta["usage"]["output_tokens"]) == (100, 7)
    assert delta["usage"]["pflash"]["keep_ratio"] == 0.5


def test_a_streamed_tool_call_is_a_tool_use_block_with_its_input_as_json():
    events = _events(
        [
            chat_chunk(META, role="assistant", content=""),
            chat_chunk(META, content="Let me check."),
            chat_chunk(META, tool_calls=with_index([CALL])),
            chat_chunk(META, finish_reason="tool_calls"),
            chat_usage_chunk(META, _usage()),
        ]
    )
    names = [name for name, _ in events]
    assert names[2:] == [
        "content_block_start",  # text, index 0
        "content_block_delta",
        "content_block_stop",
        "content_block_start",  # tool_use, index 1
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start, delta = events[5][1], events[6][1]
    assert start["index"] == 1
    assert start["content_block"] == {
        "type": "tool_use",
        "id": "call_abc",
        "name": "get_weather",
        "input": {},
    }
    assert delta["delta"] == {"type": "input_json_delta", "partial_json": '{"city": "Paris"}'}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"  # fmt: skip


def test_a_failure_mid_stream_ends_it_with_an_error_event():
    status, body = error_response(TimeoutError())
    events = _events([chat_chunk(META, role="assistant", content=""), StreamError(status, body)])
    assert [name for name, _ in events] == ["message_start", "ping", "error"]
    assert events[-1][1]["error"]["type"] == "timeout_error"
