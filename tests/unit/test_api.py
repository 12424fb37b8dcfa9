"""The OpenAI surface: validation envelopes, usage/timings/pflash keys, SSE chunk shapes."""

from __future__ import annotations

import json

import openai.types
import openai.types.chat
import pytest
from pydantic import ValidationError

from pflash.config import build_config
from pflash.errors import CompressionFailed, InvalidRequest, ModelUnavailable, StageUnavailable
from pflash.models.target.protocol import (
    GenerationTimings,
    SamplingParams,
    UpstreamError,
    UpstreamTimeout,
)
from pflash.serving.chat_completion.serving import (
    chat_chunk,
    chat_response,
    chat_usage_chunk,
    parse_chat_request,
)
from pflash.serving.completion.serving import (
    completion_chunk,
    completion_response,
    completion_usage_chunk,
    parse_completion_request,
)
from pflash.serving.envelope import (
    SSE_DONE,
    SSE_KEEPALIVE,
    error_response,
    public_message,
    sse_event,
)
from pflash.serving.models import ModelCard, ModelList
from pflash.serving.protocol import ResponseMeta
from pflash.serving.usage import PFlashStats, ViewStats, build_usage

USER = {"role": "user", "content": "hi"}


def chat_error(body) -> tuple[int, dict]:
    with pytest.raises(InvalidRequest) as info:
        parse_chat_request(body)
    return error_response(info.value)


def envelope(message: str, param: str | None, code: str) -> dict:
    return {
        "error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    }


# ---------------------------------------------------------------------- validation

CHAT_CASES = [
    pytest.param(
        {"messages": []},
        envelope("messages: messages must not be empty", "messages", "invalid_value"),
        id="empty-messages",
    ),
    pytest.param(
        {},
        envelope("messages: Field required", "messages", "missing_required_parameter"),
        id="missing-messages",
    ),
    pytest.param(
        {"messages": "hi"},
        envelope("messages: Input should be a valid list (got 'hi')", "messages", "invalid_type"),
        id="messages-not-a-list",
    ),
    pytest.param(
        {"messages": [USER, {"role": "robot", "content": "x"}]},
        envelope(
            "messages[1].role: Input should be 'system', 'developer', 'user', 'assistant' or 'tool' (got 'robot')",
            "messages[1].role",
            "invalid_value",
        ),
        id="unknown-role",
    ),
    pytest.param(
        {"messages": [{"role": "user"}]},
        envelope(
            "messages[0].content: a user message needs content",
            "messages[0].content",
            "missing_required_parameter",
        ),
        id="user-without-content",
    ),
    pytest.param(
        {"messages": [{"role": "user", "content": 7}]},
        envelope(
            "messages[0].content: content must be a string or a list of text parts (got 7)",
            "messages[0].content",
            "invalid_type",
        ),
        id="content-wrong-type",
    ),
    pytest.param(
        {
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ]
        },
        envelope(
            "messages[0].content: content part 0 has type 'image_url': only text parts "
            '({"type": "text", "text": "..."}) are supported',
            "messages[0].content",
            "invalid_value",
        ),
        id="image-part",
    ),
    pytest.param(
        {"messages": [{"role": "assistant"}]},
        envelope(
            "messages[0].content: an assistant message needs content or tool_calls",
            "messages[0].content",
            "missing_required_parameter",
        ),
        id="empty-assistant",
    ),
    pytest.param(
        {"messages": [{"role": "tool", "content": "42"}]},
        envelope(
            "messages[0].tool_call_id: a tool message needs tool_call_id",
            "messages[0].tool_call_id",
            "missing_required_parameter",
        ),
        id="tool-without-id",
    ),
    pytest.param(
        {"messages": [{"role": "user", "content": "x", "tool_calls": []}]},
        envelope(
            "messages[0].tool_calls: only assistant messages carry tool_calls",
            "messages[0].tool_calls",
            "invalid_value",
        ),
        id="tool-calls-on-user",
    ),
    pytest.param(
        {"messages": [USER], "max_tokens": "5"},
        envelope(
            "max_tokens: Input should be a valid integer (got '5')", "max_tokens", "invalid_type"
        ),
        id="max-tokens-string",
    ),
    pytest.param(
        {"messages": [USER], "max_tokens": 0},
        envelope(
            "max_tokens: Input should be greater than or equal to 1 (got 0)",
            "max_tokens",
            "invalid_value",
        ),
        id="max-tokens-zero",
    ),
    pytest.param(
        {"messages": [USER], "temperature": 3},
        envelope(
            "temperature: Input should be less than or equal to 2 (got 3)",
            "temperature",
            "invalid_value",
        ),
        id="temperature-too-high",
    ),
    pytest.param(
        {"messages": [USER], "stream": "yes"},
        envelope("stream: Input should be a valid boolean (got 'yes')", "stream", "invalid_type"),
        id="stream-not-bool",
    ),
    pytest.param(
        {"messages": [USER], "stop": 5},
        envelope(
            "stop: stop must be a non-empty string or a list of them (got 5)",
            "stop",
            "invalid_type",
        ),
        id="stop-wrong-type",
    ),
    pytest.param(
        {"messages": [USER], "n": 2},
        envelope("n: only n=1 is supported (got 2)", "n", "unsupported_value"),
        id="n-greater-than-one",
    ),
    pytest.param(
        {"messages": [USER], "pflash_keep_ratio": 0},
        envelope(
            "pflash_keep_ratio: Input should be greater than 0 (got 0)",
            "pflash_keep_ratio",
            "invalid_value",
        ),
        id="keep-ratio-zero",
    ),
    pytest.param(
        {"messages": [USER], "pflash_keep_ratio": 1.01},
        envelope(
            "pflash_keep_ratio: Input should be less than or equal to 1 (got 1.01)",
            "pflash_keep_ratio",
            "invalid_value",
        ),
        id="keep-ratio-above-one",
    ),
    pytest.param(
        {"messages": [USER], "pflash_keep_ratio": "0.5"},
        envelope(
            "pflash_keep_ratio: Input should be a valid number (got '0.5')",
            "pflash_keep_ratio",
            "invalid_type",
        ),
        id="keep-ratio-string",
    ),
    pytest.param(
        {"messages": [USER], "pflash_mode": "sometimes"},
        envelope(
            "pflash_mode: Input should be 'off', 'auto' or 'always' (got 'sometimes')",
            "pflash_mode",
            "invalid_value",
        ),
        id="unknown-mode",
    ),
    pytest.param(
        {"messages": [USER], "pflash_required": ["a", 3]},
        envelope(
            "pflash_required[1]: Input should be a valid string (got 3)",
            "pflash_required[1]",
            "invalid_type",
        ),
        id="required-not-strings",
    ),
    pytest.param(
        {"messages": [USER], "pflash_query": ""},
        envelope(
            "pflash_query: String should have at least 1 character (got '')",
            "pflash_query",
            "invalid_value",
        ),
        id="empty-query",
    ),
    pytest.param(
        {"messages": [USER], "session_id": 12},
        envelope(
            "session_id: Input should be a valid string (got 12)", "session_id", "invalid_type"
        ),
        id="session-id-int",
    ),
    pytest.param(
        {"messages": [USER], "pflash_return_prompt": 1},
        envelope(
            "pflash_return_prompt: Input should be a valid boolean (got 1)",
            "pflash_return_prompt",
            "invalid_type",
        ),
        id="return-prompt-int",
    ),
    pytest.param(
        {"messages": [USER], "pflash_keepratio": 0.5},
        envelope(
            "pflash_keepratio: unknown PFlash field 'pflash_keepratio'",
            "pflash_keepratio",
            "unsupported_value",
        ),
        id="misspelt-extension",
    ),
    pytest.param(
        {"messages": [USER], "stream_options": {"include_usage": True}},
        envelope(
            "stream_options: stream_options is only allowed when stream is true",
            "stream_options",
            "unsupported_value",
        ),
        id="stream-options-without-stream",
    ),
    pytest.param(
        {"messages": [USER], "logprobs": True},
        envelope(
            "logprobs: logprobs is not supported by this server", "logprobs", "unsupported_value"
        ),
        id="logprobs",
    ),
    pytest.param(
        {"messages": [USER], "chat_template_kwargs": ["enable_thinking"]},
        envelope(
            "chat_template_kwargs: Input should be a valid dictionary",
            "chat_template_kwargs",
            "invalid_type",
        ),
        id="template-kwargs-not-dict",
    ),
    pytest.param(
        {"messages": [USER], "tools": [{"type": "function", "function": {"name": ""}}]},
        envelope(
            "tools[0].function.name: String should have at least 1 character (got '')",
            "tools[0].function.name",
            "invalid_value",
        ),
        id="tool-without-name",
    ),
]


@pytest.mark.parametrize(("body", "expected"), CHAT_CASES)
def test_invalid_chat_request_is_400_naming_the_field(body, expected):
    status, payload = chat_error(body)
    assert status == 400
    assert payload == expected


def test_malformed_json_and_non_object_bodies_are_400():
    assert chat_error(b"{bad") == (
        400,
        envelope(
            "request body is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
            None,
            "invalid_json",
        ),
    )
    assert chat_error(b"[1, 2]") == (
        400,
        envelope("request body must be a JSON object", None, "invalid_type"),
    )


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"prompt": ["a", "b"]}, "prompt", "prompt: only one prompt per request is supported"),
        ({"prompt": ""}, "prompt", "prompt: prompt must not be empty (got '')"),
        ({"prompt": [1, True]}, "prompt", "prompt: prompt must be a string or a list of token ids"),
        ({"prompt": "x", "echo": True}, "echo", "echo: echo is not supported by this server"),
        (
            {"prompt": "x", "best_of": 3},
            "best_of",
            "best_of: best_of is not supported by this server",
        ),
        ({}, "prompt", "prompt: Field required"),
    ],
)
def test_invalid_completion_request_is_400_naming_the_field(body, param, message):
    with pytest.raises(InvalidRequest) as info:
        parse_completion_request(body)
    status, payload = error_response(info.value)
    assert status == 400
    assert payload["error"]["param"] == param
    assert payload["error"]["message"] == message


def test_full_chat_request_normalises_content_and_sampling():
    body = {
        "model": "m",
        "messages": [
            {"role": "developer", "content": "be brief"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "42"},
        ],
        "max_tokens": 9,
        "max_completion_tokens": 5,
        "temperature": 0,
        "stop": "END",
        "seed": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        ],
        "chat_template_kwargs": {"enable_thinking": False},
        "pflash_mode": "always",
        "pflash_keep_ratio": 1,
        "pflash_query": "q",
        "pflash_required": ["must"],
        "session_id": "s1",
        "user": "ignored",
        "n": 1,
    }
    req = parse_chat_request(json.dumps(body).encode())
    assert req.template_messages() == [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": "a\nb"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    assert req.sampling_params() == SamplingParams(
        max_tokens=5, temperature=0.0, top_p=1.0, stop=("END",), seed=3
    )
    assert req.include_usage is True
    assert req.template_tools() == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]
    assert (req.pflash_mode, req.pflash_keep_ratio, req.pflash_query) == ("always", 1.0, "q")
    assert (req.pflash_required, req.session_id, req.chat_template_kwargs) == (
        ["must"],
        "s1",
        {"enable_thinking": False},
    )


def test_openai_defaults_when_fields_are_absent():
    req = parse_chat_request({"messages": [USER]})
    assert req.sampling_params() == SamplingParams(
        max_tokens=None, temperature=1.0, top_p=1.0, stop=(), seed=None
    )
    assert (req.stream, req.include_usage, req.pflash_mode, req.pflash_return_prompt) == (
        False,
        False,
        None,
        False,
    )


def test_completion_prompt_accepts_text_token_ids_and_a_single_item_list():
    assert parse_completion_request({"prompt": "abc"}).prompt == "abc"
    assert parse_completion_request({"prompt": [1, 2, 3]}).prompt == [1, 2, 3]
    assert parse_completion_request(
        {"prompt": ["abc"], "stop": ["x", "y"]}
    ).sampling_params().stop == ("x", "y")


def test_server_rules_reject_return_prompt_and_required_when_not_allowed():
    req = parse_chat_request(
        {"messages": [USER], "pflash_return_prompt": True, "pflash_required": ["x"]}
    )
    req.check_allowed(build_config({"return_prompt_enabled": True}, env={}))
    with pytest.raises(InvalidRequest) as info:
        req.check_allowed(build_config({}, env={}))
    assert (info.value.param, info.value.http_status) == ("pflash_return_prompt", 400)
    legacy = build_config({"return_prompt_enabled": True, "select_mode": "legacy"}, env={})
    with pytest.raises(InvalidRequest) as info:
        req.check_allowed(legacy)
    assert info.value.param == "pflash_required"


def test_stats_reject_keys_outside_the_contract():
    with pytest.raises(ValidationError):
        PFlashStats(kept_tokens=1, new_tokens=3)


# ---------------------------------------------------------------------- usage contract

TIMINGS = GenerationTimings(
    prompt_n=120, prompt_ms=35.1234, predicted_n=7, predicted_ms=70.5, cache_n=880
)


def compressed_stats() -> PFlashStats:
    return PFlashStats(
        compress_ms=123.456,
        drafter_input_tokens=20000,
        kept_tokens=1000,
        compressed_tokens=1003,
        keep_ratio=0.05,
        query_rule="prompt_end",
        history_queries=2,
        segments=40,
        stop_reason="budget_reached",
        scorer_resume=18000,
        scorer_new_tokens=2000,
        scorer_forward_ms=80.0,
        view=ViewStats(
            mode="continue", turn=3, served_tokens=1003, reused_tokens=880, delta_tokens=123
        ),
    )


def test_usage_serialises_exactly_the_contract_keys():
    usage = build_usage(20000, TIMINGS, compressed_stats()).model_dump()
    assert set(usage) == {
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "prompt_tokens_details",
        "timings",
    }
    assert usage["prompt_tokens_details"] == {"cached_tokens": 880}
    assert set(usage["timings"]) == {
        "prompt_n",
        "prompt_ms",
        "predicted_n",
        "predicted_ms",
        "cache_n",
        "pflash",
    }
    assert set(usage["timings"]["pflash"]) == {
        "compress_ms",
        "plan_ms",
        "select_ms",
        "drafter_wait_ms",
        "probe_wait_ms",
        "view_ms",
        "drafter_input_tokens",
        "kept_tokens",
        "compressed_tokens",
        "served_ratio",
        "keep_ratio",
        "budget_ratio",
        "query_rule",
        "history_queries",
        "segments",
        "stop_reason",
        "scorer_resume",
        "scorer_new_tokens",
        "scorer_forward_ms",
        "lexical_units",
        "lexical_kept",
        "lexical_units_reused",
        "semantic_passages",
        "semantic_blocks",
        "semantic_ms",
        "semantic_reused",
        "semantic_prefetched",
        "projection_passages",
        "projection_ms",
        "question_kind",
        "view",
    }
    assert set(usage["timings"]["pflash"]["view"]) == {
        "mode",
        "turn",
        "served_tokens",
        "reused_tokens",
        "delta_tokens",
        "recalled_tokens",
        "fresh_tokens",
    }


def test_usage_counts_original_prompt_and_generation_timings():
    usage = build_usage(20000, TIMINGS, compressed_stats()).model_dump()
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (
        20000,
        7,
        20007,
    )
    timings = {k: v for k, v in usage["timings"].items() if k != "pflash"}
    assert timings == {
        "prompt_n": 120,
        "prompt_ms": 35.123,
        "predicted_n": 7,
        "predicted_ms": 70.5,
        "cache_n": 880,
    }
    assert usage["timings"]["pflash"]["compress_ms"] == 123.5
    assert usage["timings"]["pflash"]["view"]["mode"] == "continue"


def test_keep_ratio_is_always_the_served_ratio():
    """`keep_ratio` is an alias of `served_ratio`: either name sets both, and stats that
    would give a client two different numbers are refused."""
    by_new = PFlashStats(served_ratio=0.25).model_dump()
    by_old = PFlashStats(keep_ratio=0.25).model_dump()
    assert (by_new["served_ratio"], by_new["keep_ratio"]) == (0.25, 0.25)
    assert by_old == by_new
    assert PFlashStats(served_ratio=0.25, keep_ratio=0.25).keep_ratio == 0.25
    with pytest.raises(ValidationError, match="alias of served_ratio"):
        PFlashStats(served_ratio=0.25, keep_ratio=0.1)


def test_uncompressed_request_reports_default_stats():
    usage = build_usage(50, GenerationTimings(50, 10.0, 3, 5.0, 0)).model_dump()
    assert usage["timings"]["pflash"] == {
        "compress_ms": 0.0,
        "plan_ms": 0.0,
        "select_ms": 0.0,
        "drafter_wait_ms": 0.0,
        "probe_wait_ms": 0.0,
        "view_ms": 0.0,
        "drafter_input_tokens": 0,
        "kept_tokens": 0,
        "compressed_tokens": 50,
        "served_ratio": 1.0,
        "keep_ratio": 1.0,
        "budget_ratio": None,
        "query_rule": "",
        "history_queries": 0,
        "segments": 0,
        "stop_reason": "",
        "scorer_resume": 0,
        "scorer_new_tokens": 0,
        "scorer_forward_ms": 0.0,
        "lexical_units": 0,
        "lexical_kept": 0,
        "lexical_units_reused": 0,
        "semantic_passages": 0,
        "semantic_blocks": 0,
        "semantic_ms": 0.0,
        "semantic_reused": 0,
        "semantic_prefetched": 0,
        "projection_passages": 0,
        "projection_ms": 0.0,
        "question_kind": None,
        "view": {
            "mode": "off",
            "turn": 0,
            "served_tokens": 0,
            "reused_tokens": 0,
            "delta_tokens": 0,
            "recalled_tokens": 0,
            "fresh_tokens": 0,
        },
    }


# ---------------------------------------------------------------------- responses and SSE


def sse_payload(event: str) -> dict:
    assert event.startswith("data: ") and event.endswith("\n\n")
    return json.loads(event[len("data: ") : -2])


def test_chat_response_parses_with_openai_types_and_keeps_timings():
    meta = ResponseMeta.new("smollm2", "chatcmpl-")
    usage = build_usage(20000, TIMINGS, compressed_stats())
    body = json.loads(chat_response(meta, "Paris.", "stop", usage).model_dump_json())
    parsed = openai.types.chat.ChatCompletion.model_validate(body)
    assert parsed.id.startswith("chatcmpl-") and parsed.model == "smollm2"
    assert parsed.choices[0].message.content == "Paris."
    assert parsed.choices[0].finish_reason == "stop"
    assert parsed.usage.prompt_tokens == 20000
    assert parsed.usage.prompt_tokens_details.cached_tokens == 880
    assert parsed.usage.model_extra["timings"]["pflash"]["kept_tokens"] == 1000
    assert "pflash_prompt" not in body


def test_pflash_prompt_appears_only_when_set():
    meta = ResponseMeta.new("m", "chatcmpl-")
    usage = build_usage(5, TIMINGS)
    body = json.loads(
        chat_response(meta, "x", "stop", usage, pflash_prompt="<served>").model_dump_json()
    )
    assert body["pflash_prompt"] == "<served>"
    body = json.loads(completion_response(meta, "x", "length", usage).model_dump_json())
    assert "pflash_prompt" not in body


def test_chat_tool_call_response_has_null_content():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    meta = ResponseMeta.new("m", "chatcmpl-")
    body = json.loads(
        chat_response(
            meta, "", "tool_calls", build_usage(5, TIMINGS), tool_calls=[call]
        ).model_dump_json()
    )
    parsed = openai.types.chat.ChatCompletion.model_validate(body)
    assert parsed.choices[0].message.content is None
    assert parsed.choices[0].message.tool_calls[0].function.name == "f"
    assert parsed.choices[0].finish_reason == "tool_calls"


def test_chat_stream_chunks_parse_with_openai_chunk_type():
    meta = ResponseMeta.new("m", "chatcmpl-")
    usage = build_usage(20000, TIMINGS, compressed_stats())
    events = [
        sse_event(chat_chunk(meta, role="assistant", content="")),
        sse_event(chat_chunk(meta, content="Par")),
        sse_event(chat_chunk(meta, content="is")),
        sse_event(chat_chunk(meta, finish_reason="stop")),
        sse_event(chat_usage_chunk(meta, usage)),
    ]
    chunks = [openai.types.chat.ChatCompletionChunk.model_validate(sse_payload(e)) for e in events]
    assert {c.id for c in chunks} == {meta.id}
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == "Paris"
    assert chunks[3].choices[0].finish_reason == "stop"
    assert chunks[4].choices == [] and chunks[4].usage.total_tokens == 20007
    assert chunks[4].usage.model_extra["timings"]["cache_n"] == 880
    assert sse_payload(events[1])["choices"][0]["delta"] == {"content": "Par"}


def test_completion_stream_chunks_parse_with_openai_completion_type():
    meta = ResponseMeta.new("m", "cmpl-")
    usage = build_usage(12, TIMINGS)
    content = sse_payload(sse_event(completion_chunk(meta, "Hel")))
    assert content == {
        "id": meta.id,
        "object": "text_completion",
        "created": meta.created,
        "model": "m",
        "choices": [{"index": 0, "text": "Hel", "finish_reason": None, "logprobs": None}],
    }
    final = openai.types.Completion.model_validate(
        sse_payload(sse_event(completion_chunk(meta, "lo", finish_reason="length")))
    )
    assert (final.choices[0].text, final.choices[0].finish_reason) == ("lo", "length")
    tail = openai.types.Completion.model_validate(
        sse_payload(sse_event(completion_usage_chunk(meta, usage)))
    )
    assert tail.choices == [] and tail.usage.completion_tokens == 7
    whole = openai.types.Completion.model_validate_json(
        completion_response(meta, "Hello", "stop", usage).model_dump_json()
    )
    assert whole.id.startswith("cmpl-") and whole.choices[0].text == "Hello"


def test_sse_framing_constants():
    assert SSE_DONE == "data: [DONE]\n\n"
    assert SSE_KEEPALIVE == ": keep-alive\n\n"
    assert sse_event({"a": "é"}) == 'data: {"a":"é"}\n\n'


def test_model_list_shape():
    body = ModelList(data=[ModelCard(id="smollm2", max_model_len=8192)]).model_dump()
    assert body == {
        "object": "list",
        "data": [
            {
                "id": "smollm2",
                "object": "model",
                "created": 0,
                "owned_by": "pflash",
                "max_model_len": 8192,
            }
        ],
    }


# ---------------------------------------------------------------------- error mapping


class BackPressureError(Exception):
    """Stands in for ray.serve.exceptions.BackPressureError (matched by class name)."""


@pytest.mark.parametrize(
    ("exc", "status", "error"),
    [
        (
            InvalidRequest("bad", param="x", code="invalid_value"),
            400,
            {
                "message": "bad",
                "type": "invalid_request_error",
                "param": "x",
                "code": "invalid_value",
            },
        ),
        (
            CompressionFailed("drafter", "out of memory"),
            500,
            {
                "message": "pflash drafter failed: out of memory",
                "type": "server_error",
                "param": None,
                "code": "pflash_drafter",
            },
        ),
        (
            CompressionFailed(
                "query_mapping", "not found", client_error=True, param="pflash_query"
            ),
            400,
            {
                "message": "pflash query_mapping failed: not found",
                "type": "invalid_request_error",
                "param": "pflash_query",
                "code": "pflash_query_mapping",
            },
        ),
        (
            ModelUnavailable("no model"),
            503,
            {"message": "no model", "type": "model_unavailable", "param": None, "code": None},
        ),
        (
            UpstreamError(
                "upstream returned HTTP 500: boom", upstream_status=500, code="upstream_http_500"
            ),
            502,
            {
                "message": "upstream returned HTTP 500: boom",
                "type": "upstream_error",
                "param": None,
                "code": "upstream_http_500",
            },
        ),
        (
            UpstreamTimeout("upstream timed out", code="upstream_timeout"),
            504,
            {
                "message": "upstream timed out",
                "type": "upstream_timeout",
                "param": None,
                "code": "upstream_timeout",
            },
        ),
        (
            BackPressureError("queue full"),
            503,
            {
                "message": "server overloaded, retry later: queue full",
                "type": "overloaded_error",
                "param": None,
                "code": "backpressure",
            },
        ),
        (
            TimeoutError(),
            504,
            {"message": "timed out", "type": "timeout_error", "param": None, "code": "timeout"},
        ),
        (
            RuntimeError("secret internals"),
            500,
            {
                "message": "internal server error (RuntimeError)",
                "type": "server_error",
                "param": None,
                "code": None,
            },
        ),
    ],
)
def test_error_response_maps_each_failure_class(exc, status, error):
    assert error_response(exc) == (status, {"error": error})


def test_pydantic_validation_error_maps_to_400_naming_the_field():
    from pflash.serving.chat_completion.protocol import ChatCompletionRequest

    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate({"messages": [USER], "top_p": 0})
    status, body = error_response(info.value)
    assert status == 400
    assert body["error"]["param"] == "top_p"


class RayActorError(Exception):
    """Stands in for ray.exceptions.RayActorError (matched by class name)."""


@pytest.mark.parametrize(
    ("exc", "public"),
    [
        (CompressionFailed("drafter", "KeyError: 'tap' at actor 4f2a"), "pflash drafter failed"),
        (RayActorError("actor 4f2a at 10.0.0.3 died"), "a model replica died, retry"),
        (RuntimeError("secret internals"), "internal server error (RuntimeError)"),
        (
            StageUnavailable("drafter", BackPressureError("num_queued_requests=6 on 10.0.0.3")),
            "pflash drafter unavailable: server overloaded, retry later",
        ),
    ],
)
def test_a_5xx_tells_the_client_the_stage_and_condition_but_no_internal_text(exc, public):
    assert public_message(exc) == public


@pytest.mark.parametrize(
    ("cause", "status", "code"),
    [
        (BackPressureError("queue full"), 503, "pflash_drafter_backpressure"),
        (RayActorError("died"), 503, "pflash_drafter_replica_unavailable"),
        (TimeoutError(), 504, "pflash_drafter_timeout"),
    ],
)
def test_a_stage_the_runtime_cannot_serve_is_a_retryable_5xx_naming_the_stage(cause, status, code):
    err = StageUnavailable("drafter", cause)
    got_status, body = error_response(err)
    assert (got_status, body["error"]["code"]) == (status, code)
    assert isinstance(err, CompressionFailed) and err.stage == "drafter"  # still fail closed
    assert err.retry_after_s >= 1
