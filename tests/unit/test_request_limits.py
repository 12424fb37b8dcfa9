"""Bodies a public endpoint must refuse as 400s: JSON the parser accepts but later
stages choke on, numbers past what the sampler holds, and requests past the server's limits."""

from __future__ import annotations

import json

import pytest
from h11._headers import normalize_and_validate
from hypothesis import given, settings
from hypothesis import strategies as st

from pflash.compress.render.rendered import RenderedPrompt
from pflash.config import build_config
from pflash.errors import InvalidRequest, ModelNotFound
from pflash.flow.request import check_prompt_limit
from pflash.models.target.protocol import SamplingParams
from pflash.serving.body import MAX_JSON_DEPTH, load_json_body
from pflash.serving.chat_completion.serving import parse_chat_request
from pflash.serving.completion.serving import parse_completion_request
from pflash.serving.envelope import error_response
from pflash.serving.protocol import (
    MAX_IDENTIFIER_CHARS,
    MAX_QUERY_CHARS,
    MAX_REQUIRED_CHARS,
    MAX_REQUIRED_STRINGS,
    MAX_STOP_CHARS,
)

USER = {"role": "user", "content": "hi"}


def chat_body(**extra) -> bytes:
    return json.dumps({"messages": [USER], **extra}).encode()


def rejected(body: bytes, parse=parse_chat_request) -> tuple[int, dict]:
    with pytest.raises(InvalidRequest) as info:
        parse(body)
    status, payload = error_response(info.value)
    return status, payload["error"]


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 900, 50_000])
def test_json_nested_past_the_limit_is_a_400_at_any_depth(depth):
    body = chat_body(chat_template_kwargs={"x": "@@"}).replace(b'"@@"', b"[" * depth + b"]" * depth)
    status, error = rejected(body)
    assert status == 400 and error["code"] == "invalid_json"
    assert f"deeper than {MAX_JSON_DEPTH}" in error["message"]


def test_json_within_the_depth_limit_is_read():
    nested = "[" * 20 + "]" * 20
    assert load_json_body(f'{{"a": {nested}}}')["a"] is not None


@pytest.mark.parametrize("literal", [b"9" * 5000, b"1" * 40, b"-" + b"1" * 30])
def test_integer_literals_of_many_digits_are_a_400(literal):
    status, error = rejected(
        b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": ' + literal + b"}"
    )
    assert status == 400 and error["code"] == "invalid_json" and "digits" in error["message"]


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_nan_and_infinity_literals_are_not_json(constant):
    status, error = rejected(
        b'{"messages": [{"role": "user", "content": "hi"}], "temperature": ' + constant + b"}"
    )
    assert status == 400 and error["code"] == "invalid_json" and "not a number" in error["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}', "messages[0].content"),
        (
            b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}',
            "messages[0].content[0].text",
        ),
        (b'{"messages": [{"role": "user", "content": "hi"}], "model": "m\\ud83d"}', "model"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "x\\ud800": 1}', None),
    ],
)
def test_lone_surrogates_are_a_400_naming_where(body, param):
    status, error = rejected(body)
    assert status == 400 and error["code"] == "invalid_unicode"
    assert error["param"] == param


def test_a_lone_surrogate_in_a_raw_prompt_is_a_400():
    status, error = rejected(b'{"prompt": "a\\udc00"}', parse_completion_request)
    assert (status, error["param"]) == (400, "prompt")


def test_valid_surrogate_pairs_are_ordinary_text():
    req = parse_chat_request(b'{"messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}')
    assert req.messages[0].content == "\U0001f600"


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1])
def test_seed_outside_64_bits_is_a_400(seed):
    status, error = rejected(chat_body(seed=seed))
    assert (status, error["param"]) == (400, "seed")


def test_64_bit_seeds_are_accepted():
    assert parse_chat_request(chat_body(seed=2**64 - 1)).seed == 2**64 - 1
    assert parse_chat_request(chat_body(seed=-(2**63))).seed == -(2**63)


def test_more_than_sixteen_stop_sequences_are_a_400():
    status, error = rejected(chat_body(stop=[f"s{i}" for i in range(17)]))
    assert (status, error["param"]) == (400, "stop")


def test_echoed_values_are_cut_short():
    status, error = rejected(chat_body(temperature="x" * 10_000))
    assert status == 400 and len(error["message"]) < 200


def test_denormal_temperatures_sample_greedily():
    assert SamplingParams(temperature=1e-320).greedy
    assert SamplingParams(temperature=0).greedy
    assert not SamplingParams(temperature=0.01).greedy


def test_a_model_the_server_does_not_serve_is_a_404_model_not_found():
    config = build_config({"served_model_names": ["pflash", "smollm2"]}, env={})
    for name in ("pflash", "smollm2"):
        parse_chat_request(chat_body(model=name)).check_allowed(config)
    parse_chat_request(chat_body()).check_allowed(config)  # no model: the first name
    with pytest.raises(ModelNotFound) as info:
        parse_chat_request(chat_body(model="gpt-4o")).check_allowed(config)
    status, payload = error_response(info.value)
    assert status == 404
    assert payload["error"]["code"] == "model_not_found" and payload["error"]["param"] == "model"
    assert "pflash, smollm2" in payload["error"]["message"]


def test_more_messages_than_max_messages_is_a_400():
    config = build_config({"max_messages": 3}, env={})
    ok = json.dumps({"messages": [USER] * 3}).encode()
    parse_chat_request(ok).check_allowed(config)
    with pytest.raises(InvalidRequest) as info:
        parse_chat_request(json.dumps({"messages": [USER] * 4}).encode()).check_allowed(config)
    assert info.value.code == "too_many_messages" and "limit of 3" in info.value.message


def test_a_prompt_past_max_prompt_tokens_is_a_400_before_any_model_runs():
    config = build_config({"max_prompt_tokens": 10}, env={})
    check_prompt_limit(RenderedPrompt("completion", tuple(range(10)), None), config)
    with pytest.raises(InvalidRequest) as info:
        check_prompt_limit(RenderedPrompt("chat", tuple(range(11)), None), config)
    assert info.value.param == "messages" and info.value.code == "context_length_exceeded"
    assert "11 tokens" in info.value.message and "at most 10" in info.value.message
    check_prompt_limit(
        RenderedPrompt("chat", tuple(range(11)), None),
        build_config({"max_prompt_tokens": None}, env={}),
    )


# ----------------------------------------------------------------------------- searched text


@pytest.mark.parametrize(
    ("extra", "param", "limit"),
    [
        ({"pflash_required": ["a"] * (MAX_REQUIRED_STRINGS + 1)}, "pflash_required", "16 items"),
        (
            {"pflash_required": ["a", "b" * (MAX_REQUIRED_CHARS + 1)]},
            "pflash_required[1]",
            "4096 characters",
        ),
        ({"pflash_query": "q" * (MAX_QUERY_CHARS + 1)}, "pflash_query", "8192 characters"),
        ({"stop": ["s" * (MAX_STOP_CHARS + 1)]}, "stop", "256 characters"),
    ],
)
def test_searched_text_past_its_limit_is_a_400_naming_the_limit(extra, param, limit):
    status, error = rejected(chat_body(**extra))
    assert (status, error["param"], error["code"]) == (400, param, "invalid_value")
    assert limit in error["message"]


def test_searched_text_at_its_limits_is_accepted():
    req = parse_chat_request(
        chat_body(
            pflash_required=["r" * MAX_REQUIRED_CHARS] * MAX_REQUIRED_STRINGS,
            pflash_query="q" * MAX_QUERY_CHARS,
            stop=["s" * MAX_STOP_CHARS],
        )
    )
    assert len(req.pflash_required) == MAX_REQUIRED_STRINGS
    assert len(req.pflash_query) == MAX_QUERY_CHARS


# ----------------------------------------------------------------------------- identifiers


@pytest.mark.parametrize("param", ["session_id"])
@pytest.mark.parametrize(
    "value",
    [
        "conversation-é",
        "a\r\nx-admin: 1",
        "a\nb",
        "nul\x00",
        "tab\there",
        " lead",
        "trail ",
        "",
        "x" * (MAX_IDENTIFIER_CHARS + 1),
        "\u2028",
    ],  # fmt: skip
)
def test_an_identifier_that_cannot_travel_as_a_header_is_a_400_naming_it(param, value):
    status, error = rejected(chat_body(**{param: value}))
    assert (status, error["param"], error["code"]) == (400, param, "invalid_value")
    assert "printable ASCII" in error["message"]


@pytest.mark.parametrize("value", ["conv-42:abc", "a b", "x" * MAX_IDENTIFIER_CHARS, "~!@#$%^&*()"])
def test_printable_ascii_identifiers_are_accepted(value):
    req = parse_chat_request(chat_body(session_id=value, user=value))
    assert req.session_id == value


def test_a_user_id_is_any_text_up_to_its_length_limit():
    """`user` reaches no header: any text is fine, only its length is bounded."""
    assert parse_chat_request(chat_body(user="Jürgen\tö")).user == "Jürgen\tö"
    status, error = rejected(chat_body(user="x" * (MAX_IDENTIFIER_CHARS + 1)))
    assert (status, error["param"]) == (400, "user")


@settings(max_examples=300)
@given(st.text(max_size=40))
def test_every_accepted_session_id_makes_a_valid_http_header(value):
    """The session id travels upstream in `x-session-id` as "{tenant}:{session_id}"."""
    try:
        req = parse_chat_request(chat_body(session_id=value))
    except InvalidRequest as err:
        assert err.param == "session_id"
        return
    normalize_and_validate([(b"x-session-id", f"tenant:{req.session_id}".encode("ascii"))])
