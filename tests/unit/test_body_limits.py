"""Limits checked before work is spent: the body arrives in time and is read linearly, the
output is capped, and a prompt certain to exceed max_prompt_tokens is refused unrendered."""

from __future__ import annotations

import asyncio
import time

import pytest

from pflash.compress.render.rendered import render_chat_prompt
from pflash.errors import InvalidRequest, PFlashError
from pflash.models.target.protocol import SamplingParams
from pflash.serving.admission import (
    TokenBound,
    body_too_large,
    cap_output,
    certain_prompt_bytes,
    check_prompt_bound,
    read_body,
)
from pflash.serving.chat_completion.protocol import ChatCompletionRequest
from pflash.serving.chat_completion.serving import parse_chat_request
from pflash.serving.completion.serving import parse_completion_request
from pflash.serving.envelope import error_response
from tests.conftest import stdlib_texts


async def _parts(body: bytes, size: int, gap_s: float = 0.0):
    for i in range(0, len(body), size):
        if gap_s:
            await asyncio.sleep(gap_s)
        yield body[i : i + size]


def _read(parts, limit: int = 1 << 20, timeout_s: float = 5.0, declared: str | None = None):
    return asyncio.run(read_body(parts, limit=limit, timeout_s=timeout_s, declared=declared))


def test_a_body_trickled_past_the_read_timeout_is_a_408_naming_it():
    started = time.perf_counter()
    with pytest.raises(PFlashError) as err:
        _read(_parts(b"x" * 100, 1, gap_s=0.05), timeout_s=0.3)  # 5 s to send it all
    elapsed = time.perf_counter() - started
    assert (err.value.http_status, err.value.code) == (408, "request_timeout")
    assert err.value.message == "the request body did not arrive within 0.3 s (body_read_timeout_s)"
    assert error_response(err.value)[0] == 408
    assert elapsed < 1.5


def test_a_body_in_many_parts_is_read_whole_in_linear_time():
    body = bytes(range(256)) * (64 << 10)  # 16 MiB in 16,384 parts of 1 KiB
    started = time.perf_counter()
    got = _read(_parts(body, 1024), limit=len(body))
    elapsed = time.perf_counter() - started
    assert got == body
    assert elapsed < 2.0  # appending to one growing bytes object copies ~137 GB here


def test_a_body_past_max_body_bytes_is_a_413_while_it_is_read():
    with pytest.raises(PFlashError) as err:
        _read(_parts(b"y" * 5000, 100), limit=4096)
    assert (err.value.http_status, err.value.code) == (413, "request_too_large")
    assert "max_body_bytes" in err.value.message


@pytest.mark.parametrize("declared", ["4097", "9" * 5000])
def test_a_declared_length_past_the_limit_is_a_413_before_any_byte_is_read(declared):
    async def never():
        raise AssertionError("the body was read")
        yield b""

    with pytest.raises(PFlashError) as err:
        _read(never(), limit=4096, declared=declared)
    assert err.value.http_status == 413
    assert body_too_large(4096).message == err.value.message


def test_a_request_without_max_tokens_gets_the_servers_output_cap():
    assert cap_output(SamplingParams(), 4096).max_tokens == 4096
    assert cap_output(SamplingParams(max_tokens=4096), 4096).max_tokens == 4096
    assert cap_output(SamplingParams(max_tokens=7), 4096).max_tokens == 7
    assert cap_output(SamplingParams(), None).max_tokens is None


def test_a_request_asking_more_than_the_output_cap_generates_at_most_the_cap():
    """A client cannot know the cap before its first call (Claude Code asks for 32,000 of a
    model it does not know): it is served, and the answer ends at the cap ("length")."""
    assert cap_output(SamplingParams(max_tokens=32000), 4096).max_tokens == 4096
    assert cap_output(SamplingParams(max_tokens=100), 4096).max_tokens == 100
    assert cap_output(SamplingParams(max_tokens=32000), None).max_tokens == 32000


def test_null_max_tokens_in_a_request_is_the_cap():
    req = parse_chat_request(
        b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": null}'
    )
    assert cap_output(req.sampling_params(), 4096).max_tokens == 4096


# ---------------------------------------------------------------------- the token lower bound


def test_the_bound_of_smollm2_is_its_longest_token(smollm2_tokenizer):
    assert TokenBound.of(smollm2_tokenizer) == TokenBound(81)


@pytest.mark.parametrize(
    "text",
    [
        " " * 10_000,  # SmolLM2 packs runs of spaces in its longest tokens
        "\n" + " " * 80 + "x",
        "=" * 5_000,
        "<|im_start|>" * 300,  # control-token text
        "é漢字🙂" * 500,
        "".join(stdlib_texts(3)),
    ],
)
def test_the_bound_never_exceeds_the_real_token_count(smollm2_tokenizer, text):
    bound = TokenBound.of(smollm2_tokenizer)
    real = len(smollm2_tokenizer(text, add_special_tokens=False)["input_ids"])
    assert bound.at_least(len(text.encode())) <= real


def test_the_longest_tokens_repeated_meet_the_bound_exactly(smollm2_tokenizer):
    """The bound is tight: a text made of the longest token, repeated, has exactly as many
    tokens as the bound says (so a larger divisor would be needed by nothing)."""
    bound = TokenBound.of(smollm2_tokenizer)
    longest = max(smollm2_tokenizer.get_vocab(), key=len)
    text = smollm2_tokenizer.convert_tokens_to_string([longest]) * 50
    real = len(smollm2_tokenizer(text, add_special_tokens=False)["input_ids"])
    assert bound.at_least(len(text.encode())) == real == 50


def test_a_tokenizer_with_a_normalizer_gets_no_bound():
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE({"a": 0, "b": 1, "ab": 2}, [("a", "b")]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    assert TokenBound.of(PreTrainedTokenizerFast(tokenizer_object=raw)) == TokenBound(2)
    raw.normalizer = normalizers.NFC()  # composing characters shrinks the text
    assert TokenBound.of(PreTrainedTokenizerFast(tokenizer_object=raw)) is None


def _chat(*contents: str, assistant: str = "") -> ChatCompletionRequest:
    messages = [{"role": "system", "content": contents[0]}]
    messages += [{"role": "user", "content": c} for c in contents[1:]]
    if assistant:
        messages.insert(1, {"role": "assistant", "content": assistant})
    return parse_chat_request({"messages": messages})


def test_certain_bytes_count_every_message_but_the_assistants():
    req = _chat("sys", "héllo", assistant="not counted")
    assert certain_prompt_bytes(req, "chat") == 3 + 6


def test_a_chat_certain_to_exceed_max_prompt_tokens_is_refused_before_rendering(
    smollm2_tokenizer,
):
    bound = TokenBound.of(smollm2_tokenizer)
    req = _chat("x" * 81 * 100, "y" * 82)  # at least 100 + 2 tokens
    with pytest.raises(InvalidRequest) as err:
        check_prompt_bound(req, "chat", bound, 101)
    assert err.value.code == "context_length_exceeded" and err.value.param == "messages"
    assert "at least 102 tokens" in err.value.message
    assert len(render_chat_prompt(smollm2_tokenizer, req.template_messages()).ids) > 101


def test_a_chat_that_may_fit_is_left_to_the_exact_count(smollm2_tokenizer):
    bound = TokenBound.of(smollm2_tokenizer)
    check_prompt_bound(_chat("x" * 81 * 100), "chat", bound, 100)
    check_prompt_bound(_chat("x" * 10**6), "chat", None, 100)  # no bound: nothing refused
    check_prompt_bound(_chat("x" * 10**6), "chat", bound, None)  # no limit


def test_a_token_id_prompt_is_counted_exactly_before_rendering():
    req = parse_completion_request({"prompt": [1] * 101})
    with pytest.raises(InvalidRequest) as err:
        check_prompt_bound(req, "completion", None, 100)
    assert err.value.param == "prompt"
    check_prompt_bound(req, "completion", None, 101)


def test_a_client_leaving_mid_body_is_a_4xx_not_a_server_error():
    from starlette.requests import ClientDisconnect

    async def leaves():
        yield b'{"messages": '
        raise ClientDisconnect()

    with pytest.raises(PFlashError) as caught:
        asyncio.run(read_body(leaves(), limit=1000, timeout_s=5, disconnect=(ClientDisconnect,)))
    assert (caught.value.http_status, caught.value.code) == (400, "client_closed")
