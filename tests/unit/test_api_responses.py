"""The OpenAI Responses API as a translation onto the chat flow: requests in, responses and
typed events out, validated against the official `openai` SDK's own types."""

from __future__ import annotations

import asyncio
import json

import openai.types.responses as rtypes
import pytest
from pydantic import TypeAdapter

from pflash.errors import InvalidRequest
from pflash.models.target.protocol import GenerationTimings
from pflash.serving.chat_completion.serving import chat_chunk, chat_response, chat_usage_chunk
from pflash.serving.envelope import SSE_KEEPALIVE, StreamError, error_response
from pflash.serving.middleware import speaks_anthropic
from pflash.serving.protocol import ResponseMeta
from pflash.serving.responses.translate import COUNT, EDGE
from pflash.serving.tool_calls import with_index
from pflash.serving.usage import PFlashStats, build_usage

EVENT = TypeAdapter(rtypes.ResponseStreamEvent)
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": False,
}
CALL = {
    "id": "call_abc",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
META = ResponseMeta("chatcmpl-00ff", "pflash", 1_700_000_000)


def _usage(prompt=120, cached=20, completion=7):
    timings = GenerationTimings(
        prompt_n=prompt - cached,
        prompt_ms=5.0,
        predicted_n=completion,
        predicted_ms=9.0,
        cache_n=cached,
    )
    return build_usage(prompt, timings, PFlashStats(compressed_tokens=60, keep_ratio=0.5))


# ---------------------------------------------------------------------- request in


def test_a_string_input_is_one_user_message_after_the_instructions():
    chat = EDGE.parse(json.dumps({"input": "Hi", "instructions": "Be brief."})).chat
    assert chat.template_messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]


def test_a_function_call_round_trip_becomes_chat_tool_messages():
    body = {
        "model": "pflash",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city": "Rome"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
            {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "21 C"}]},
        ],
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "store": True,
        "parallel_tool_calls": True,
    }  # fmt: skip
    chat = EDGE.parse(body).chat
    messages = chat.template_messages()
    assert messages[0] == {"role": "user", "content": "Weather in Paris?"}
    assert messages[1]["content"] == "Checking."
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["call_1", "call_2"]
    assert messages[2:] == [
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "21 C"},
    ]
    assert chat.template_tools() == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": WEATHER["parameters"],
                "strict": False,
            },
        }
    ]
    assert chat.callable_tools() == frozenset({"get_weather"})


def test_a_count_renders_the_prompt_the_same_responses_request_renders():
    """`input_tokens` takes the conversation; what renders is what `/v1/responses` runs."""
    conversation = {
        "model": "pflash",
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "18 C"},
        ],
        "tools": [WEATHER],
        "tool_choice": "required",
        "session_id": "s-1",
    }  # fmt: skip
    counted = COUNT.parse(json.dumps(conversation)).chat
    served = EDGE.parse({**conversation, "max_output_tokens": 64, "stream": True}).chat
    assert counted.template_messages() == served.template_messages()
    assert counted.template_tools() == served.template_tools()
    assert (counted.tool_choice, counted.session_id) == (served.tool_choice, "s-1")
    answer = rtypes.InputTokenCountResponse.model_validate(COUNT.answer(77))
    assert (answer.object, answer.input_tokens) == ("response.input_tokens", 77)


@pytest.mark.parametrize("parse", [EDGE.parse, COUNT.parse], ids=["create", "count"])
@pytest.mark.parametrize("field", ["previous_response_id", "conversation"])
def test_server_side_state_is_a_400_saying_the_server_is_stateless(parse, field):
    with pytest.raises(InvalidRequest) as err:
        parse({"input": "Hi", field: "conv_1" if field == "conversation" else "resp_1"})
    assert (err.value.http_status, err.value.param) == (400, field)
    assert "stateless" in err.value.message and field in err.value.message


def test_sampling_and_pflash_fields_reach_the_chat_request():
    chat = EDGE.parse(
        {
            "input": "Hi",
            "max_output_tokens": 16,
            "temperature": 0.0,
            "top_p": 0.5,
            "stream": True,
            "pflash_mode": "always",
            "pflash_required": ["quokka"],
            "session_id": "s-1",
        }
    ).chat
    params = chat.sampling_params()
    assert (params.max_tokens, params.temperature, params.top_p) == (16, 0.0, 0.5)
    assert (chat.pflash_mode, chat.pflash_required, chat.session_id) == (
        "always",
        ["quokka"],
        "s-1",
    )
    assert chat.stream and chat.include_usage  # response.completed reports usage


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id", "stateless"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]", "'item_reference' is not supported"),
        ({"input": "x", "background": True}, "background", "stateless"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0].type", "input_text"),
        ({"input": "x", "tools": [{"type": "namespace", "name": "ns", "tools": [{"type": "web_search"}]}]}, "tools[0].tools[0]", "function"),
        ({"input": "x", "tools": [{"type": "function", "name": "a__b"}, {"type": "namespace", "name": "a", "tools": [{"type": "function", "name": "b"}]}]}, "tools", "two tools"),
        ({"input": "x", "tool_choice": {"type": "function", "name": "nowhere"}}, "tool_choice", "names no single"),
        ({"input": []}, "input", "must not be empty"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "greater than or equal to 1"),
        ({"input": "x", "pflash_mode": "sometimes"}, "pflash_mode", "always"),
        ({}, "input", "required"),
    ],
)  # fmt: skip
def test_bad_input_is_a_400_naming_the_field(body, param, words):
    with pytest.raises(InvalidRequest) as err:
        EDGE.parse(body)
    assert err.value.http_status == 400
    assert err.value.param == param
    assert words in err.value.message


def test_errors_keep_the_openai_envelope():
    _, body = error_response(InvalidRequest("bad", param="input"))
    assert body == {
        "error": {"message": "bad", "type": "invalid_request_error", "param": "input", "code": None}
    }
    version = [(b"anthropic-version", b"2023-06-01")]  # an Anthropic SDK's header changes nothing
    for path in ("/v1/responses", "/v1/responses/input_tokens"):
        assert not speaks_anthropic({"type": "http", "path": path, "headers": version})


# ---------------------------------------------------------------------- response out


def test_a_text_answer_is_one_completed_message_with_usage_and_pflash_stats():
    source = {"input": "Hi", "instructions": "Be brief.", "tools": [WEATHER]}
    body, headers = EDGE.parse(source).respond(
        chat_response(META, "Paris.", "stop", _usage(), pflash_prompt="served")
    )
    response = rtypes.Response.model_validate(body)
    assert (response.id, response.status, response.output_text) == (
        "resp_00ff",
        "completed",
        "Paris.",
    )
    assert response.instructions == "Be brief." and response.tools[0].name == "get_weather"
    assert response.usage.input_tokens == 120
    assert response.usage.input_tokens_details.cached_tokens == 20
    assert response.usage.output_tokens == 7 and response.usage.total_tokens == 127
    assert body["usage"]["pflash"]["keep_ratio"] == 0.5 and body["pflash_prompt"] == "served"
    assert json.loads(headers["x-pflash-stats"])["compressed_tokens"] == 60  # fmt: skip


def test_a_tool_call_answer_is_a_function_call_item():
    body, _ = EDGE.parse({"input": "Hi"}).respond(
        chat_response(META, "", "tool_calls", _usage(), tool_calls=[CALL])
    )
    response = rtypes.Response.model_validate(body)
    (item,) = response.output
    assert (item.type, item.call_id, item.name, item.arguments) == (
        "function_call",
        "call_abc",
        "get_weather",
        '{"city": "Paris"}',
    )


def test_a_cut_off_answer_is_incomplete_for_max_output_tokens():
    body, _ = EDGE.parse({"input": "Hi"}).respond(chat_response(META, "Par", "length", _usage()))
    response = rtypes.Response.model_validate(body)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"


# ---------------------------------------------------------------------- stream out


async def _items(*items):
    for item in items:
        yield item


def _events(items, source=None) -> list[dict]:
    exchange = EDGE.parse(source or {"input": "Hi", "stream": True})

    async def collect():
        return [frame async for frame in exchange.stream(_items(*items))]

    out = []
    for frame in asyncio.run(collect()):
        if frame == SSE_KEEPALIVE:
            out.append({"type": "keep-alive"})
            continue
        head, data = frame.strip().split("\n")
        payload = json.loads(data.removeprefix("data: "))
        assert payload["type"] == head.removeprefix("event: ")
        EVENT.validate_python(payload)  # the SDK's own event types
        out.append(payload)
    return out


def test_a_streamed_text_answer_sends_the_typed_events_in_order():
    events = _events(
        [
            SSE_KEEPALIVE,
            chat_chunk(META, role="assistant", content=""),
            chat_chunk(META, content="Par"),
            chat_chunk(META, content="is."),
            chat_chunk(META, finish_reason="stop"),
            chat_usage_chunk(META, _usage()),
        ]
    )
    assert [e["type"] for e in events] == [
        "keep-alive",
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events[1:]] == list(range(10))
    assert events[7]["text"] == "Paris."
    done = rtypes.Response.model_validate(events[-1]["response"])
    assert done.output_text == "Paris." and done.usage.output_tokens == 7


def test_a_streamed_tool_call_sends_its_arguments_and_a_function_call_item():
    events = _events(
        [
            chat_chunk(META, role="assistant", content=""),
            chat_chunk(META, tool_calls=with_index([CALL])),
            chat_chunk(META, finish_reason="tool_calls"),
            chat_usage_chunk(META, _usage()),
        ]
    )
    assert [e["type"] for e in events[2:]] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[3]["delta"] == events[4]["arguments"] == '{"city": "Paris"}'
    (item,) = rtypes.Response.model_validate(events[-1]["response"]).output
    assert (item.type, item.call_id) == ("function_call", "call_abc")


def test_a_cut_off_stream_ends_with_response_incomplete():
    events = _events(
        [
            chat_chunk(META, role="assistant", content=""),
            chat_chunk(META, content="Par"),
            chat_chunk(META, finish_reason="length"),
            chat_usage_chunk(META, _usage()),
        ]
    )
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_a_failure_mid_stream_ends_it_with_an_error_event():
    status, body = error_response(TimeoutError())
    events = _events([chat_chunk(META, role="assistant", content=""), StreamError(status, body)])
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "error"]
    assert events[-1]["code"] == "timeout"
