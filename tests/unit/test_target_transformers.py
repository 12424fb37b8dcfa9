"""TransformersTarget with the real embedded SmolLM2: parity with `generate`, stops, seeds,
KV prefix snapshots; plus the pure pieces (streaming decoder, sampler, snapshot LRU)."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from pflash.errors import InvalidRequest
from pflash.models.target.decoding import StreamingDecoder, sample_token
from pflash.models.target.hf import PrefixSnapshots, TransformersTarget
from pflash.models.target.protocol import (
    GenerationDone,
    OutputFormat,
    SamplingParams,
    TokenDelta,
    collect_generation,
)

GREEDY = SamplingParams(max_tokens=12, temperature=0)


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    from pflash.models.loading import load_causal_lm

    return load_causal_lm("embedded:smollm2-135m").model


@pytest.fixture
def target(model, smollm2_tokenizer):
    """A fresh target (empty snapshot store) per test; the model is shared."""
    t = TransformersTarget(model, smollm2_tokenizer, num_threads=1)
    yield t
    asyncio.run(t.aclose())


def chat_ids(tokenizer, messages) -> list[int]:
    return list(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)[
            "input_ids"
        ]
    )


@pytest.fixture(scope="module")
def france(smollm2_tokenizer) -> list[int]:
    return chat_ids(
        smollm2_tokenizer, [{"role": "user", "content": "What is the capital of France?"}]
    )


def run(target, prompt_ids, params=GREEDY, **kw):
    return asyncio.run(collect_generation(target.generate(prompt_ids, params, **kw)))


# ---------------------------------------------------------------------- generation


def test_greedy_output_equals_model_generate(target, model, smollm2_tokenizer, france):
    expected = model.generate(torch.tensor([france]), max_new_tokens=12, do_sample=False)[
        0, len(france) :
    ].tolist()
    result = run(target, france)
    eos = smollm2_tokenizer.eos_token_id
    assert expected[-1] == eos  # the reference stopped on EOS within 12 tokens
    assert result.token_ids == expected[:-1]
    assert (
        result.text == smollm2_tokenizer.decode(expected[:-1]) == "The capital of France is Paris."
    )
    assert result.finish_reason == "stop"
    t = result.timings
    assert (t.prompt_n, t.cache_n, t.predicted_n) == (len(france), 0, len(expected))
    assert t.prompt_ms > 0 and t.predicted_ms > 0


def test_stream_is_token_deltas_then_one_done_event(target, france):
    async def events():
        return [e async for e in target.generate(france, GREEDY)]

    out = asyncio.run(events())
    assert all(isinstance(e, TokenDelta) and e.text and e.token_ids for e in out[:-1])
    assert isinstance(out[-1], GenerationDone)
    assert len(out) - 1 == 7  # one delta per answer token: all plain ASCII words


def test_stop_string_ends_generation_and_is_not_emitted(target, france):
    result = run(
        target, france, SamplingParams(max_tokens=12, temperature=0, stop=(" Paris", "zzz"))
    )
    assert result.text == "The capital of France is"
    assert result.finish_reason == "stop"
    assert result.timings.predicted_n == 6  # " Paris" was sampled, then cut


def test_max_tokens_ends_with_finish_reason_length(target, smollm2_tokenizer, france):
    result = run(target, france, SamplingParams(max_tokens=3, temperature=0))
    assert result.finish_reason == "length"
    assert result.timings.predicted_n == 3
    assert result.text == "The capital of"
    assert smollm2_tokenizer.decode(result.token_ids) == result.text


def test_same_seed_samples_the_same_tokens(target, france):
    params = SamplingParams(max_tokens=8, temperature=1.0, top_p=0.95, seed=7)
    first, again = run(target, france, params), run(target, france, params)
    other = run(target, france, SamplingParams(max_tokens=8, temperature=1.0, top_p=0.95, seed=8))
    assert first.token_ids == again.token_ids
    assert first.text == again.text
    assert other.token_ids != first.token_ids


def test_context_left_clamps_max_tokens_and_overflow_is_400(model, smollm2_tokenizer, france):
    small = TransformersTarget(model, smollm2_tokenizer, max_context=len(france) + 2)
    result = run(small, france, SamplingParams(max_tokens=10, temperature=0))
    assert (result.finish_reason, result.timings.predicted_n) == ("length", 2)
    with pytest.raises(InvalidRequest) as info:
        run(small, france + [198, 198])
    assert (info.value.http_status, info.value.code) == (400, "context_length_exceeded")
    asyncio.run(small.aclose())


TITLE = {
    "type": "object",
    "properties": {"title": {"type": "string", "maxLength": 40}},
    "required": ["title"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_an_answer_asked_for_a_schema_is_json_matching_it(target, france, temperature):
    """The sampler is masked by the schema's grammar at every step: the answer parses and
    has the schema's keys, greedy or sampled, and ends by itself (the schema bounds the
    string, so the grammar closes the object within the token budget)."""
    schema = OutputFormat("json_schema", json.dumps(TITLE), "title", True)
    params = SamplingParams(max_tokens=80, temperature=temperature, seed=3, output_format=schema)
    result = run(target, france, params)
    assert result.finish_reason == "stop", result.text
    value = json.loads(result.text)
    assert list(value) == ["title"] and len(value["title"]) <= 40
    # any object: the answer opens one (an unbounded object may run to max_tokens)
    anything = SamplingParams(
        max_tokens=8, temperature=0, output_format=OutputFormat("json_object")
    )
    assert run(target, france, anything).text.lstrip().startswith("{")


def test_token_outside_vocabulary_is_invalid_request(target):
    with pytest.raises(InvalidRequest) as info:
        run(target, [1, 2, 10**7])
    assert info.value.param == "prompt"


# ---------------------------------------------------------------------- prefix snapshots


def test_prompt_extending_a_snapshot_prefills_only_new_tokens(
    target, model, smollm2_tokenizer, france
):
    first = run(target, france)
    messages = [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": first.text},
        {"role": "user", "content": "And of Italy?"},
    ]
    turn2 = chat_ids(smollm2_tokenizer, messages)
    assert turn2[: len(france)] == france

    cached = run(target, turn2)
    assert cached.timings.cache_n == len(france)
    assert cached.timings.prompt_n == len(turn2) - len(france)

    scratch_target = TransformersTarget(model, smollm2_tokenizer, snapshot_capacity=0)
    scratch = run(scratch_target, turn2)
    asyncio.run(scratch_target.aclose())
    assert scratch.timings.cache_n == 0
    assert cached.token_ids == scratch.token_ids
    assert cached.text == scratch.text


def test_snapshot_cut_bounds_the_reused_prefix(target, france):
    cut = len(france) - 3  # where "<|im_start|>assistant\n" begins
    run(target, france, snapshot_cut=cut)
    again = run(target, france)
    assert again.timings.cache_n == cut
    assert again.timings.prompt_n == 3


def test_generated_tokens_never_enter_the_snapshot(target, france):
    first = run(target, france)
    follow = france + first.token_ids + [2, 198]
    result = run(target, follow, SamplingParams(max_tokens=1, temperature=0))
    assert result.timings.cache_n == len(france)


def test_repeated_prompt_prefills_one_token_and_answers_the_same(target, france):
    first = run(target, france)
    again = run(target, france)
    assert (again.timings.cache_n, again.timings.prompt_n) == (len(france) - 1, 1)
    assert again.token_ids == first.token_ids


# ---------------------------------------------------------------------- serving behaviour


def test_event_loop_stays_responsive_while_generating(target, france):
    async def scenario():
        ticks = 0
        done = asyncio.Event()

        async def ticker():
            nonlocal ticks
            while not done.is_set():
                await asyncio.sleep(0.005)
                ticks += 1

        task = asyncio.create_task(ticker())
        result = await collect_generation(target.generate(france, GREEDY))
        done.set()
        await task
        return result, ticks

    result, ticks = asyncio.run(scenario())
    elapsed_ms = result.timings.prompt_ms + result.timings.predicted_ms
    assert ticks >= elapsed_ms / 5 / 4  # at least a quarter of the ticks an idle loop would make


def test_closing_the_stream_early_leaves_the_target_usable(target, france):
    async def first_delta():
        stream = target.generate(france, SamplingParams(max_tokens=12, temperature=0))
        event = await anext(stream)
        await stream.aclose()
        return event

    event = asyncio.run(first_delta())
    assert event.text == "The"
    assert run(target, france).text == "The capital of France is Paris."


# ---------------------------------------------------------------------- pure pieces


def decode_stream(tokenizer, text: str, stop=()) -> tuple[list[str], str, bool]:
    decoder = StreamingDecoder(tokenizer, stop)
    pieces = [decoder.push(t) for t in tokenizer.encode(text)]
    return pieces, decoder.finish(), decoder.stopped


def test_streaming_decoder_never_emits_broken_utf8(smollm2_tokenizer):
    text = "naïve café 🙂 世界 ok"
    ids = smollm2_tokenizer.encode(text)
    assert len(ids) > len(text.split())  # multi-byte characters span several tokens
    pieces, tail, _ = decode_stream(smollm2_tokenizer, text)
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) + tail == text


def test_streaming_decoder_cuts_a_stop_string_spanning_tokens(smollm2_tokenizer):
    pieces, tail, stopped = decode_stream(
        smollm2_tokenizer, "alpha beta<END>gamma", stop=("<END>",)
    )
    assert stopped is True
    assert "".join(pieces) + tail == "alpha beta"


def test_streaming_decoder_releases_held_text_when_no_stop_follows(smollm2_tokenizer):
    pieces, tail, stopped = decode_stream(smollm2_tokenizer, "alpha beta<EN", stop=("<END>",))
    assert stopped is False
    assert "".join(pieces) == "alpha beta"
    assert tail == "<EN"


def test_streaming_decoder_cuts_at_the_stop_string_that_starts_first(smollm2_tokenizer):
    # the shorter stop ends first, the longer one starts first: the cut is at the longer
    stops = ("b</a>", "<a>b</a>", "zzz")
    pieces, tail, stopped = decode_stream(smollm2_tokenizer, "alpha <a>b</a> gamma", stops)
    assert stopped is True
    assert "".join(pieces) + tail == "alpha "


def test_top_p_near_zero_samples_the_argmax():
    logits = torch.tensor([0.1, 2.0, 1.9, -1.0])
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=1.0, top_p=1e-6)
    assert {sample_token(logits, params, gen) for _ in range(20)} == {1}
    assert sample_token(logits, SamplingParams(temperature=0), None) == 1


def test_snapshot_store_keeps_the_longest_prefix_and_evicts_lru():
    def kv(n):
        return [(torch.zeros(1, 1, n, 2), torch.zeros(1, 1, n, 2))]

    store = PrefixSnapshots(capacity=2)
    store.store(torch.tensor([1, 2, 3]), kv(3))
    store.store(torch.tensor([1, 2, 3, 4, 5]), kv(5))  # supersedes [1, 2, 3]
    assert len(store) == 1
    store.store(torch.tensor([1, 2]), kv(2))  # already covered
    assert len(store) == 1
    assert store.lookup(torch.tensor([1, 2, 3, 9]))[0] == 3
    store.store(torch.tensor([7, 8]), kv(2))
    store.store(torch.tensor([5, 6]), kv(2))  # evicts the least recently used, [1..5]
    assert store.lookup(torch.tensor([1, 2, 3]))[0] == 0
    assert store.lookup(torch.tensor([7, 8, 9]))[0] == 2


def test_a_stop_string_completed_by_the_last_held_piece_is_cut(smollm2_tokenizer):
    """Generation ends on a token that stops inside a character (" " and the first byte of
    a three-byte one): that piece was held back, and with the held "A" it completes the stop
    string "A ", which must be cut at finish like anywhere else."""
    vocab = smollm2_tokenizer.get_vocab()
    decoder = StreamingDecoder(smollm2_tokenizer, ("A ",))
    pieces = [decoder.push(vocab["A"]), decoder.push(vocab["Ġâ"])]
    assert pieces == ["", ""]  # "A" could start the stop; " \ufffd" is an unfinished char
    assert decoder.finish() == ""
    assert decoder.stopped is True
