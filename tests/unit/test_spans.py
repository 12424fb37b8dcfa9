"""Span algebra and the tokenizer bridge (pflash/spans.py): set semantics and covering maps."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pflash.compress.text.encoding import encode_as_written_with_offsets
from pflash.spans import (
    MAX_INSTRUCTION_SPANS,
    Span,
    SpanIndex,
    canonicalize,
    decode_ids,
    intersect,
    map_span,
    subtract,
    total_tokens,
    union,
    validate_spans,
)

LIMIT = 60
spans_strategy = st.lists(
    st.tuples(st.integers(0, LIMIT), st.integers(0, LIMIT)).map(lambda t: Span(*t)), max_size=12
)


def tokens_of(spans) -> set[int]:
    return {i for s in spans for i in range(s.begin, s.end)}


def assert_canonical(spans) -> None:
    assert all(not s.empty for s in spans)
    assert all(a.end < b.begin for a, b in zip(spans, spans[1:], strict=False)), spans


@given(spans_strategy)
def test_canonicalize_is_sorted_disjoint_nonadjacent_and_keeps_the_token_set(spans):
    canon = canonicalize(spans)
    assert_canonical(canon)
    assert list(canon) == sorted(canon)
    assert tokens_of(canon) == tokens_of(spans)
    assert total_tokens(spans) == len(tokens_of(spans))


@given(spans_strategy)
def test_canonicalize_is_idempotent(spans):
    once = canonicalize(spans)
    assert canonicalize(once) == once


@given(spans_strategy, spans_strategy)
def test_union_subtract_intersect_match_set_operations(a, b):
    for result, expected in (
        (union(a, b), tokens_of(a) | tokens_of(b)),
        (subtract(a, b), tokens_of(a) - tokens_of(b)),
        (intersect(a, b), tokens_of(a) & tokens_of(b)),
    ):
        assert_canonical(result)
        assert tokens_of(result) == expected


@given(spans_strategy, spans_strategy)
def test_one_cut_subtracted_from_each_span_in_turn_matches_set_difference(a, b):
    cut = SpanIndex(b)
    for span in a:
        part = cut.subtract([span])
        assert_canonical(part)
        assert tokens_of(part) == tokens_of([span]) - tokens_of(b)


@given(spans_strategy, spans_strategy)
def test_a_span_index_covers_a_span_when_one_of_its_canonical_spans_holds_all_of_it(a, b):
    index = SpanIndex(b)
    for span in (s for s in a if s.begin <= s.end):  # units: never inverted
        want = any(k.begin <= span.begin and span.end <= k.end for k in canonicalize(b))
        assert index.covers(span) == want, (span, index.spans)


@given(spans_strategy)
def test_canonical_spans_in_range_validate(spans):
    canon = canonicalize(spans)
    assert validate_spans(canon, LIMIT) is None


@pytest.mark.parametrize(
    ("spans", "reason"),
    [
        ([Span(-1, 3)], "before 0"),
        ([Span(3, 3)], "empty"),
        ([Span(5, 3)], "reversed"),
        ([Span(0, 4), Span(3, 6)], "overlaps"),
        ([Span(5, 6), Span(0, 2)], "overlaps or precedes"),
        ([Span(0, LIMIT + 1)], "past the input"),
        ([Span(2 * i, 2 * i + 1) for i in range(MAX_INSTRUCTION_SPANS + 1)], "exceeds the limit"),
    ],
)
def test_invalid_instruction_spans_are_rejected_with_a_reason(spans, reason):
    assert reason in validate_spans(spans, 1000 if len(spans) > 2 else LIMIT)


# ------------------------------------------------------------------ tokenizer bridge

ASCII = st.text(
    alphabet=st.characters(min_codepoint=32, max_codepoint=126) | st.sampled_from("\n\t"),
    min_size=1,
    max_size=80,
)
UNICODE = st.text(
    alphabet=st.characters(min_codepoint=32, max_codepoint=126) | st.sampled_from("\néü中文—🎉｜▁"),
    min_size=1,
    max_size=80,
)
bridge_settings = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _char_range(data, text):
    b = data.draw(st.integers(0, len(text) - 1))
    e = data.draw(st.integers(b + 1, len(text)))
    return b, e


@bridge_settings
@given(text=ASCII, data=st.data())
def test_token_span_decodes_to_a_superset_of_the_characters_ascii(
    smollm2_tokenizer, bpe_tokenizer, text, data
):
    b, e = _char_range(data, text)
    for tok in (smollm2_tokenizer, bpe_tokenizer):
        enc = encode_as_written_with_offsets(tok, text)
        span = enc.token_span(b, e)
        assert text[b:e] in decode_ids(tok, enc.ids[span.begin : span.end])


@bridge_settings
@given(text=UNICODE, data=st.data())
def test_token_span_decodes_to_a_superset_of_the_characters_unicode(smollm2_tokenizer, text, data):
    b, e = _char_range(data, text)
    enc = encode_as_written_with_offsets(smollm2_tokenizer, text)
    span = enc.token_span(b, e)
    assert text[b:e] in decode_ids(smollm2_tokenizer, enc.ids[span.begin : span.end])


@bridge_settings
@given(text=UNICODE, data=st.data())
def test_map_span_covers_the_source_characters_across_vocabularies(
    smollm2_tokenizer, bpe_tokenizer, text, data
):
    src = encode_as_written_with_offsets(smollm2_tokenizer, text)
    dst = encode_as_written_with_offsets(bpe_tokenizer, text)
    b = data.draw(st.integers(0, len(src) - 1))
    e = data.draw(st.integers(b + 1, len(src)))
    for a, z in ((src, dst), (dst, src)):
        span = Span(min(b, len(a) - 1), min(e, len(a)))
        mapped = map_span(span, a, z)
        sb, se = a.char_span(span)
        mb, me = z.char_span(mapped)
        assert mb <= sb and me >= se


@bridge_settings
@given(text=ASCII, data=st.data())
def test_map_span_onto_the_same_tokenization_is_the_identity(smollm2_tokenizer, text, data):
    enc = encode_as_written_with_offsets(smollm2_tokenizer, text)
    b = data.draw(st.integers(0, len(enc) - 1))
    e = data.draw(st.integers(b + 1, len(enc)))
    assert map_span(Span(b, e), enc, enc) == Span(b, e)


def test_map_span_refuses_different_texts(smollm2_tokenizer):
    with pytest.raises(ValueError):
        map_span(
            Span(0, 1),
            encode_as_written_with_offsets(smollm2_tokenizer, "a b"),
            encode_as_written_with_offsets(smollm2_tokenizer, "a c"),
        )


@pytest.mark.parametrize(
    "text",
    [
        "plain words and 42 numbers",
        "héllo wörld 😀 — naïve café <|im_start|>user\nhi<|im_end|>\n  trailing  ",
        "<|im_start|>system\n\tindented\r\n<|endoftext|>",
    ],
)
def test_decoding_through_the_fast_tokenizer_gives_the_text_transformers_decode_gives(
    smollm2_tokenizer, text
):
    """decode_ids asks the Rust tokenizer directly; the text must be exactly what
    transformers' own decode (no cleanup, special tokens kept) gives, ids as ints or numpy."""
    import numpy as np

    ids = smollm2_tokenizer(text, add_special_tokens=False)["input_ids"]
    expected = smollm2_tokenizer.decode(
        ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
    )
    assert decode_ids(smollm2_tokenizer, tuple(ids)) == expected
    assert decode_ids(smollm2_tokenizer, np.asarray(ids, dtype=np.int64)) == expected
    assert decode_ids(smollm2_tokenizer, ids[3:7]) == smollm2_tokenizer.decode(
        ids[3:7], skip_special_tokens=False, clean_up_tokenization_spaces=False
    )


def test_a_tokenizer_with_its_own_decode_keeps_it(smollm2_tokenizer):
    """A subclass that overrides decode is not bypassed."""

    class Shouting(type(smollm2_tokenizer)):
        def decode(self, ids, **kwargs):
            return super().decode(ids, **kwargs).upper()

    tok = copy.copy(smollm2_tokenizer)
    tok.__class__ = Shouting
    ids = smollm2_tokenizer("quiet words", add_special_tokens=False)["input_ids"]
    assert decode_ids(tok, ids) == "QUIET WORDS"
