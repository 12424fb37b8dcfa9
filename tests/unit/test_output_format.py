"""Structured output: each API's way of asking for JSON becomes the one `OutputFormat` the
target gets, a target that cannot constrain its decoding refuses it with a 400 naming the
API's own field, and bad formats are 400s naming the field."""

from __future__ import annotations

import json

import openai.types.responses as rtypes
import pytest

from pflash.config import build_config
from pflash.errors import InvalidRequest
from pflash.models.target.protocol import GenerationTimings, OutputFormat
from pflash.serving.chat_completion.serving import chat_response, parse_chat_request
from pflash.serving.completion.serving import parse_completion_request
from pflash.serving.messages import translate as messages
from pflash.serving.output_format import MAX_SCHEMA_CHARS
from pflash.serving.protocol import ResponseMeta
from pflash.serving.responses import translate as responses
from pflash.serving.usage import PFlashStats, build_usage

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}
HI = [{"role": "user", "content": "Hi"}]
CHAT_SCHEMA = {"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA, "strict": True}}  # fmt: skip
TRANSFORMERS = build_config({}, env={})
UPSTREAMS = [
    build_config({"target_backend": "openai", "upstream_base_url": "http://127.0.0.1:9/v1",
                  "upstream_model": "m"}, env={}),
    build_config({"target_backend": "ray_llm", "upstream_model": "m"}, env={}),
]  # fmt: skip


def chat(response_format):
    return parse_chat_request({"messages": HI, "response_format": response_format})


def messages_chat(**fields):
    body = {"model": "pflash", "max_tokens": 16, "messages": HI, **fields}
    return messages.EDGE.parse(json.dumps(body)).chat


def responses_chat(**fields):
    return responses.EDGE.parse(json.dumps({"input": "Hi", **fields})).chat


def test_each_api_asks_the_target_for_the_same_schema():
    expected = OutputFormat("json_schema", json.dumps(SCHEMA), "place", True)
    assert chat(CHAT_SCHEMA).sampling_params().output_format == expected
    flat = {"type": "json_schema", "name": "place", "schema": SCHEMA, "strict": True}
    assert responses_chat(text={"format": flat}).sampling_params().output_format == expected
    # Anthropic's formats have no name and are always strict
    anthropic_format = {"type": "json_schema", "schema": SCHEMA}
    for fields in ({"output_config": {"format": anthropic_format, "effort": "low"}},
                   {"output_format": anthropic_format}):  # fmt: skip
        got = messages_chat(**fields).sampling_params().output_format
        assert got == OutputFormat("json_schema", json.dumps(SCHEMA), "output", True)
    # and what the upstream receives is the chat request's own response_format
    assert expected.response_format() == CHAT_SCHEMA


def test_json_object_and_text_formats():
    assert chat({"type": "json_object"}).sampling_params().output_format == OutputFormat(
        "json_object"
    )
    assert responses_chat(text={"format": {"type": "json_object"}}).sampling_params().output_format == OutputFormat("json_object")  # fmt: skip
    assert OutputFormat("json_object").response_format() == {"type": "json_object"}
    for free in (
        chat({"type": "text"}),
        parse_chat_request({"messages": HI}),
        responses_chat(text={"format": {"type": "text"}, "verbosity": "low"}),
        responses_chat(),
        messages_chat(output_config={"effort": "high"}),
        messages_chat(),
    ):
        assert free.sampling_params().output_format is None
        free.check_allowed(TRANSFORMERS)  # free text is served by every target


def test_completions_take_a_response_format_as_vllm_does():
    req = parse_completion_request({"prompt": "Hi", "response_format": {"type": "json_object"}})
    assert req.sampling_params().output_format == OutputFormat("json_object")


@pytest.mark.parametrize(
    "make",
    [
        lambda: chat(CHAT_SCHEMA),
        lambda: responses_chat(text={"format": {"type": "json_object"}}),
        lambda: messages_chat(output_config={"format": {"type": "json_schema", "schema": SCHEMA}}),
        lambda: messages_chat(output_format={"type": "json_schema", "schema": SCHEMA}),
    ],
    ids=["chat", "responses", "messages", "messages-beta"],
)  # fmt: skip
def test_every_target_backend_takes_a_format(make):
    """vLLM behind openai or ray_llm compiles it into a grammar; the in-process transformers
    target masks its sampler with one (models/target/constrained.py)."""
    req = make()
    assert req.sampling_params().output_format is not None
    for config in (TRANSFORMERS, *UPSTREAMS):
        req.check_allowed(config)


@pytest.mark.parametrize(
    "parse, param",
    [
        (lambda: chat({"type": "regex", "regex": "a+"}), "response_format"),
        (lambda: chat({"type": "json_schema"}), "response_format.json_schema"),
        (lambda: chat({"type": "json_schema", "json_schema": {"name": "a b", "schema": SCHEMA}}),
         "response_format.json_schema.name"),
        (lambda: chat({"type": "json_schema", "json_schema": {"name": "a", "schema": [1]}}),
         "response_format.json_schema.schema"),
        (lambda: chat("json"), "response_format"),
        (lambda: chat({"type": "json_schema", "json_schema": {"name": "a", "schema": {
            "description": "x" * MAX_SCHEMA_CHARS}}}), "response_format.json_schema.schema"),
        (lambda: responses_chat(text={"format": {"type": "json_schema", "schema": SCHEMA}}),
         "text.format.name"),
        (lambda: responses_chat(text={"format": {"type": "grammar"}}), "text.format"),
        (lambda: messages_chat(output_config={"format": {"type": "json_schema"}}),
         "output_config.format.schema"),
        (lambda: messages_chat(output_config={"format": {"type": "json_object"}}),
         "output_config.format.type"),
    ],
    ids=["unknown-type", "no-json-schema", "bad-name", "schema-not-object", "not-object",
         "schema-too-long", "responses-no-name", "responses-unknown-type",
         "messages-no-schema", "messages-json-object"],
)  # fmt: skip
def test_a_bad_format_is_a_400_naming_the_field(parse, param):
    with pytest.raises(InvalidRequest) as err:
        parse()
    assert err.value.param == param


def test_a_messages_request_gives_its_format_once():
    fmt = {"type": "json_schema", "schema": SCHEMA}
    with pytest.raises(InvalidRequest, match="once"):
        messages_chat(output_config={"format": fmt}, output_format=fmt)


def test_a_response_reports_the_format_it_was_asked_for():
    meta = ResponseMeta("chatcmpl-00ff", "pflash", 1_700_000_000)
    flat = {"type": "json_schema", "name": "place", "schema": SCHEMA, "strict": True}
    timings = GenerationTimings(
        prompt_n=9, prompt_ms=5.0, predicted_n=12, predicted_ms=9.0, cache_n=0
    )
    usage = build_usage(9, timings, PFlashStats(compressed_tokens=0, keep_ratio=1.0))
    answer = chat_response(meta, '{"city": "Paris", "population": 2100000}', "stop", usage)
    for fmt in (flat, {"type": "json_object"}, None):
        source = {"input": "Hi", **({"text": {"format": fmt}} if fmt else {})}
        body, _ = responses.EDGE.parse(json.dumps(source)).respond(answer)
        response = rtypes.Response.model_validate(body)
        assert body["text"]["format"] == (fmt or {"type": "text"})
        assert json.loads(response.output_text)["city"] == "Paris"
