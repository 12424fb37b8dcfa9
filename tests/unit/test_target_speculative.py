"""Speculative greedy decoding in TransformersTarget with the real embedded SmolLM2 as target.

Two assistants bound the acceptance: SmolLM2 itself (every draft accepted) and a tiny
random-weight llama with SmolLM2's vocabulary (almost every draft rejected). Either way the
answer must be token for token the plain greedy answer; that is the contract.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch

from pflash.errors import ConfigError
from pflash.models.target.decoding import accept_drafts
from pflash.models.target.hf import TransformersTarget, vocabulary_mismatch
from pflash.models.target.protocol import (
    GenerationDone,
    SamplingParams,
    TokenDelta,
    collect_generation,
)
from pflash_lab.bench.speculative import chat_ids, random_assistant


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    from pflash.models.loading import load_causal_lm

    return load_causal_lm("embedded:smollm2-135m").model


@pytest.fixture(scope="module")
def tiny(smollm2_tokenizer):
    return random_assistant(len(smollm2_tokenizer))


def make_target(model, tokenizer, **kw):
    return TransformersTarget(model, tokenizer, num_threads=1, **kw)


@pytest.fixture
def plain(model, smollm2_tokenizer):
    t = make_target(model, smollm2_tokenizer)
    yield t
    asyncio.run(t.aclose())


@pytest.fixture
def same(model, smollm2_tokenizer):
    """SmolLM2 drafting for itself (shared weights): the acceptance upper bound."""
    t = make_target(
        model,
        smollm2_tokenizer,
        assistant=model,
        assistant_tokenizer=smollm2_tokenizer,
        speculative_tokens=4,
    )
    yield t
    asyncio.run(t.aclose())


@pytest.fixture
def rejecting(model, smollm2_tokenizer, tiny):
    """A random-weight assistant: the acceptance lower bound."""
    t = make_target(model, smollm2_tokenizer, assistant=tiny, speculative_tokens=3)
    yield t
    asyncio.run(t.aclose())


def user_turn(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


@pytest.fixture(scope="module")
def france(smollm2_tokenizer) -> list[int]:
    return chat_ids(smollm2_tokenizer, user_turn("What is the capital of France?"))


@pytest.fixture(scope="module")
def poem(smollm2_tokenizer) -> list[int]:
    return chat_ids(smollm2_tokenizer, user_turn("Write a short poem about the sea."))


def run(target, prompt_ids, params, **kw):
    return asyncio.run(collect_generation(target.generate(prompt_ids, params, **kw)))


GREEDY_16 = SamplingParams(max_tokens=16, temperature=0)


@pytest.fixture(scope="module")
def poem_answer(model, smollm2_tokenizer, poem):
    """The plain greedy answer to `poem` (16 tokens, no EOS)."""
    t = make_target(model, smollm2_tokenizer)
    result = run(t, poem, GREEDY_16)
    asyncio.run(t.aclose())
    return result


# ---------------------------------------------------------------------- the contract


def test_self_drafting_answers_as_plain_greedy_and_accepts_every_draft(same, poem, poem_answer):
    expected = poem_answer
    result = run(same, poem, GREEDY_16)
    assert result.token_ids == expected.token_ids
    assert result.text == expected.text
    assert (result.finish_reason, result.timings.predicted_n) == ("length", 16)
    assert expected.accept_rate is None
    assert result.accept_rate is not None and result.accept_rate >= 0.95


def test_random_assistant_answers_as_plain_greedy_and_is_almost_always_rejected(
    plain, rejecting, poem, france
):
    for prompt in (poem, france):
        expected = run(plain, prompt, GREEDY_16)
        result = run(rejecting, prompt, GREEDY_16)
        assert result.token_ids == expected.token_ids
        assert result.text == expected.text
        assert result.finish_reason == expected.finish_reason
        assert result.timings.predicted_n == expected.timings.predicted_n
        assert result.accept_rate is not None and 0.0 <= result.accept_rate <= 0.2


def test_eos_inside_an_accepted_run_ends_the_answer(same, france):
    result = run(same, france, SamplingParams(max_tokens=12, temperature=0))
    assert result.text == "The capital of France is Paris."
    assert result.finish_reason == "stop"
    assert result.timings.predicted_n == 8  # 7 answer tokens and the EOS
    assert result.accept_rate == 1.0


def test_stop_string_with_speculation_cuts_like_plain_decoding(same, rejecting, france):
    params = SamplingParams(max_tokens=12, temperature=0, stop=(" Paris", "zzz"))
    for target in (same, rejecting):
        result = run(target, france, params)
        assert result.text == "The capital of France is"
        assert result.finish_reason == "stop"
        assert result.timings.predicted_n == 6  # " Paris" was sampled, then cut


@pytest.mark.parametrize("max_tokens", [2, 3, 6])
def test_max_tokens_is_never_exceeded_by_a_draft_run(same, plain, poem, max_tokens):
    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    expected = run(plain, poem, params)
    result = run(same, poem, params)
    assert result.finish_reason == "length"
    assert result.timings.predicted_n == max_tokens
    assert result.token_ids == expected.token_ids


def test_one_token_answer_runs_no_speculation(same, france):
    result = run(same, france, SamplingParams(max_tokens=1, temperature=0))
    assert result.text == "The"
    assert result.accept_rate is None


def test_sampling_requests_decode_normally_and_report_no_accept_rate(plain, same, france):
    params = SamplingParams(max_tokens=8, temperature=1.0, top_p=0.95, seed=7)
    expected = run(plain, france, params)
    result = run(same, france, params)
    assert result.token_ids == expected.token_ids
    assert result.accept_rate is None


def test_accepted_tokens_stream_as_deltas_of_several_tokens(same, poem, poem_answer):
    async def events():
        return [e async for e in same.generate(poem, GREEDY_16)]

    out = asyncio.run(events())
    deltas, done = out[:-1], out[-1]
    assert all(isinstance(e, TokenDelta) and e.text and e.token_ids for e in deltas)
    assert isinstance(done, GenerationDone) and done.accept_rate >= 0.95
    ids = [t for e in deltas for t in e.token_ids]
    assert ids == poem_answer.token_ids
    assert len(deltas) < len(ids) / 2  # up to k + 1 = 5 tokens per step


def test_prefix_snapshots_keep_working_with_speculation(same, plain, smollm2_tokenizer, france):
    first = run(same, france, GREEDY_16)
    messages = [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": first.text},
        {"role": "user", "content": "And of Italy?"},
    ]
    turn2 = chat_ids(smollm2_tokenizer, messages)
    cached = run(same, turn2, GREEDY_16)
    assert cached.timings.cache_n == len(france)
    assert len(same.draft_snapshots) == 1  # the assistant keeps its own, cut the same way
    assert cached.token_ids == run(plain, turn2, GREEDY_16).token_ids
    assert cached.accept_rate >= 0.95


# ---------------------------------------------------------------------- refusals


def test_assistant_with_another_tokenizer_is_refused(model, smollm2_tokenizer, bpe_tokenizer):
    other = random_assistant(len(bpe_tokenizer))
    with pytest.raises(ConfigError) as info:
        make_target(model, smollm2_tokenizer, assistant=other, assistant_tokenizer=bpe_tokenizer)
    assert info.value.key == "speculative_drafter"
    assert "same vocabulary" in info.value.message
    assert f"{len(bpe_tokenizer)} tokens, the target's {len(smollm2_tokenizer)}" in (
        info.value.message
    )
    with pytest.raises(ConfigError, match="embedding has 1500 rows"):  # no tokenizer given
        make_target(model, smollm2_tokenizer, assistant=random_assistant(1500))


def test_vocabulary_mismatch_names_the_first_differing_token(smollm2_tokenizer):
    class Swapped:
        def get_vocab(self):
            vocab = dict(smollm2_tokenizer.get_vocab())
            a, b = smollm2_tokenizer.convert_ids_to_tokens([100, 200])
            vocab[a], vocab[b] = 200, 100
            return vocab

    assert vocabulary_mismatch(smollm2_tokenizer, smollm2_tokenizer) is None
    token = smollm2_tokenizer.convert_ids_to_tokens(100)
    assert vocabulary_mismatch(smollm2_tokenizer, Swapped()) == (
        f"token {token!r} is id 100 for the target but 200 for the drafter"
    )


@pytest.mark.parametrize("k", [0, 17])
def test_draft_length_outside_1_to_16_is_refused(model, smollm2_tokenizer, tiny, k):
    with pytest.raises(ConfigError) as info:
        make_target(model, smollm2_tokenizer, assistant=tiny, speculative_tokens=k)
    assert info.value.key == "speculative_tokens"


def speculative_config(**overrides) -> SimpleNamespace:
    """The config fields `from_config` reads, with the speculative knobs (PFlashConfig names)."""
    fields = {
        "target": "embedded:smollm2-135m",
        "target_tokenizer": None,
        "drafter": "embedded:smollm2-135m",
        "drafter_tokenizer": None,
        "device": "cpu",
        "max_context": None,
        "speculative_tokens": 2,
        "speculative_drafter": None,
    }
    return SimpleNamespace(**{**fields, **overrides})


def test_from_config_refuses_a_drafter_with_another_tokenizer_before_loading_weights(
    tmp_path, bpe_tokenizer, monkeypatch
):
    random_assistant(len(bpe_tokenizer)).save_pretrained(tmp_path)
    bpe_tokenizer.save_pretrained(tmp_path)

    def no_weights(*args, **kw):
        raise AssertionError("weights were loaded before the tokenizer check")

    monkeypatch.setattr("pflash.models.loading.load_causal_lm", no_weights)
    config = speculative_config(speculative_drafter=str(tmp_path))
    with pytest.raises(ConfigError) as info:
        TransformersTarget.from_config(config)
    assert (info.value.key, info.value.value) == ("speculative_drafter", str(tmp_path))
    assert "shares the target's tokenizer" in info.value.message


def test_from_config_drafts_with_the_drafter_model_by_default(model, monkeypatch, france):
    loads = []

    def load(spec, **kw):
        loads.append(spec)
        return SimpleNamespace(model=model)

    monkeypatch.setattr("pflash.models.loading.load_causal_lm", load)
    target = TransformersTarget.from_config(speculative_config(), num_threads=1)
    assert loads == ["embedded:smollm2-135m"]  # the drafter is the target: weights shared
    assert (target.assistant, target.speculative_tokens) == (model, 2)
    result = run(target, france, SamplingParams(max_tokens=12, temperature=0))
    assert (result.text, result.accept_rate) == ("The capital of France is Paris.", 1.0)
    asyncio.run(target.aclose())

    off = TransformersTarget.from_config(speculative_config(speculative_tokens=0))
    assert off.assistant is None
    assert run(off, france, SamplingParams(max_tokens=3, temperature=0)).accept_rate is None
    asyncio.run(off.aclose())


# ---------------------------------------------------------------------- pure rule


def test_accept_drafts_keeps_the_agreeing_prefix_then_the_targets_token():
    assert accept_drafts([5, 6, 7], [5, 6, 7, 8]) == [5, 6, 7, 8]  # all accepted + bonus
    assert accept_drafts([5, 6, 7], [5, 9, 7, 8]) == [5, 9]  # corrected at the 2nd draft
    assert accept_drafts([5, 6, 7], [1, 6, 7, 8]) == [1]  # nothing accepted
    assert accept_drafts([], [4]) == [4]
    with pytest.raises(ValueError):
        accept_drafts([5, 6], [5, 6])
