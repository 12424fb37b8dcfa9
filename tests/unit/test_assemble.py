"""Assembly: paragraph join, drafter -> target re-encoding, ceiling retry, recall text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pflash.compress.assemble import (
    EXTRA_CEILING_ATTEMPTS,
    Assembly,
    assemble,
    ceiling_retry_scale,
    clean_excerpt,
    fit_ceiling,
    paragraph_join,
    recall_block,
    recall_text,
)
from pflash.compress.text.encoding import encode_as_written_with_offsets
from pflash.errors import CompressionFailed
from pflash.spans import Span, decode_ids

CHAT = (
    "<|im_start|>system\nYou answer questions about the documents.<|im_end|>\n"
    "<|im_start|>user\nDocument 1: The Rolling Stones toured Europe in 1967 with other bands."
    " Document 2: Die Ärzte spielten in Zürich; naïve fans queued for hours.\n"
    "Document 3: 東京 hosted the final concert of the season, and the crowd sang along.\n\n"
    "Which band toured Europe in 1967?<|im_end|>\n<|im_start|>assistant\n"
)


def target_len(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def fake_assembly(counted: int, join_overhead: int = 0) -> Assembly:
    """An Assembly whose ceiling-counted size is `counted` target tokens."""
    return Assembly(
        kept_spans=(Span(0, 1),),
        run_texts=("x",),
        text="x",
        target_ids=tuple(range(counted + join_overhead)),
        join_overhead=join_overhead,
    )


# --------------------------------------------------------------------------- paragraph join


@pytest.mark.parametrize(
    ("pieces", "joined"),
    [
        (["other bands.", "Document 1:"], "other bands.\n\nDocument 1:"),
        (["other bands.\n", "Document 1:"], "other bands.\n\nDocument 1:"),
        (["other bands.", "\nDocument 1:"], "other bands.\n\nDocument 1:"),
        (["other bands.\n\n", "Document 1:"], "other bands.\n\nDocument 1:"),
        (["other bands.", "\n\nDocument 1:"], "other bands.\n\nDocument 1:"),
        (["other bands.\n", "\nDocument 1:"], "other bands.\n\nDocument 1:"),
        (["other bands.\n\n", "\nDocument 1:"], "other bands.\n\n\nDocument 1:"),
    ],
    ids=[
        "neither_side_newline",
        "left_newline",
        "right_newline",
        "left_already_double",
        "right_already_double",
        "both_sides_newline",
        "both_sides_one_double",
    ],
)
def test_paragraph_join_junction_rule(pieces, joined):
    assert paragraph_join(pieces) == joined


def test_paragraph_join_skips_empty_pieces_and_joins_many():
    assert paragraph_join(["a", "", "b\n", "c"]) == "a\n\nb\n\nc"
    assert paragraph_join(["only"]) == "only"
    assert paragraph_join([]) == ""


# --------------------------------------------------------------------------- assembly

TOKENIZER_PAIRS = [
    ("smollm2_tokenizer", "smollm2_tokenizer"),
    ("bpe_tokenizer", "smollm2_tokenizer"),
    ("smollm2_tokenizer", "bpe_tokenizer"),
]


def kept_runs(n: int) -> tuple[Span, ...]:
    """Three non-adjacent runs: the head (system turn), a middle slice, the tail."""
    return (Span(0, 12), Span(n // 3, n // 3 + n // 6), Span(n - n // 5, n))


@pytest.mark.parametrize(("drafter_name", "target_name"), TOKENIZER_PAIRS)
def test_assembly_round_trip_across_tokenizers(request, drafter_name, target_name):
    drafter = request.getfixturevalue(drafter_name)
    target = request.getfixturevalue(target_name)
    ids = encode_as_written_with_offsets(drafter, CHAT).ids
    spans = kept_runs(len(ids))

    out = assemble(drafter, target, ids, spans, paragraph_join=True)

    runs = [decode_ids(drafter, ids[s.begin : s.end]) for s in spans]
    plain = decode_ids(drafter, [i for s in spans for i in ids[s.begin : s.end]])
    assert out.run_texts == tuple(runs)
    assert out.text == paragraph_join(runs)
    assert out.text != plain  # the cuts really got breaks
    assert decode_ids(target, out.target_ids) == out.text
    assert out.target_ids == tuple(target(out.text, add_special_tokens=False)["input_ids"])
    assert out.join_overhead == target_len(target, out.text) - target_len(target, plain)
    assert out.join_overhead > 0
    assert out.ceiling_tokens == len(out.target_ids) - out.join_overhead
    assert out.kept_spans == spans


@pytest.mark.parametrize(("drafter_name", "target_name"), TOKENIZER_PAIRS)
def test_chat_markers_in_kept_text_become_target_marker_tokens(request, drafter_name, target_name):
    drafter = request.getfixturevalue(drafter_name)
    target = request.getfixturevalue(target_name)
    ids = encode_as_written_with_offsets(drafter, CHAT).ids
    out = assemble(drafter, target, ids, kept_runs(len(ids)), paragraph_join=True)
    im_start = target.convert_tokens_to_ids("<|im_start|>")
    im_end = target.convert_tokens_to_ids("<|im_end|>")
    assert out.target_ids[0] == im_start
    assert out.target_ids.count(im_start) == out.text.count("<|im_start|>") >= 2
    assert out.target_ids.count(im_end) == out.text.count("<|im_end|>") >= 1


def test_without_paragraph_join_text_is_the_plain_decode(smollm2_tokenizer, bpe_tokenizer):
    ids = encode_as_written_with_offsets(bpe_tokenizer, CHAT).ids
    spans = kept_runs(len(ids))
    out = assemble(bpe_tokenizer, smollm2_tokenizer, ids, spans, paragraph_join=False)
    assert out.text == decode_ids(bpe_tokenizer, [i for s in spans for i in ids[s.begin : s.end]])
    assert out.join_overhead == 0
    assert out.ceiling_tokens == len(out.target_ids) == target_len(smollm2_tokenizer, out.text)


def test_single_kept_run_has_no_junction(smollm2_tokenizer):
    ids = encode_as_written_with_offsets(smollm2_tokenizer, CHAT).ids
    out = assemble(smollm2_tokenizer, smollm2_tokenizer, ids, [Span(5, 40)], paragraph_join=True)
    assert out.text == decode_ids(smollm2_tokenizer, ids[5:40])
    assert out.target_ids == tuple(ids[5:40])
    assert out.join_overhead == 0


@pytest.mark.parametrize(
    "spans",
    [(), (Span(0, 4), Span(4, 9)), (Span(5, 9), Span(0, 3)), (Span(0, 4), Span(10, 10_000))],
    ids=["empty", "touching", "unsorted", "out_of_range"],
)
def test_non_canonical_or_empty_kept_spans_fail_closed(smollm2_tokenizer, spans):
    ids = encode_as_written_with_offsets(smollm2_tokenizer, CHAT).ids
    with pytest.raises(CompressionFailed) as err:
        assemble(smollm2_tokenizer, smollm2_tokenizer, ids, spans, paragraph_join=True)
    assert err.value.stage == "assembly"


@pytest.mark.parametrize("key", ["select_container_headers", "select_container_header_max"])
def test_the_removed_container_header_keys_fail_naming_what_to_do(key):
    """Never built (only false was accepted) or read by nothing: a config that still sets
    them fails at startup saying so, never silently ignored."""
    from pflash.config import build_config
    from pflash.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        build_config({key: False}, env={})
    assert err.value.key == key and "removed" in str(err.value)


# --------------------------------------------------------------------------- ceiling retry


def test_tokenizer_overshoot_is_retried_with_tightened_ratio():
    """The #724 case: 5272 target tokens against a ceiling of 5253."""
    sizes = iter([5272, 5240])
    calls: list[float] = []

    def attempt(r: float) -> Assembly:
        calls.append(r)
        return fake_assembly(next(sizes))

    fit = fit_ceiling(attempt, 0.2, 5253)
    assert calls == [0.2, 0.2 * (5253 - 19 - 1) / 5253]
    assert fit.attempts == 2
    assert fit.r_used == calls[1]
    assert fit.assembly.ceiling_tokens == 5240


def test_join_overhead_does_not_count_against_the_ceiling():
    fit = fit_ceiling(lambda r: fake_assembly(100, join_overhead=12), 0.1, 100)
    assert fit.attempts == 1
    assert fit.assembly.n_target_tokens == 112


def test_join_overhead_that_overflows_the_context_is_retried_until_the_prompt_fits():
    """A 128K prompt fitted to an 8K context keeps ~130 spans: under the ceiling without the
    join overhead, over the context with it (8189 + 16 > 8192 measured through the app)."""
    calls: list[float] = []

    def attempt(r: float) -> Assembly:
        calls.append(r)
        counted = round(8176 * r / 0.06)  # fewer kept tokens at a lower ratio
        return fake_assembly(counted, join_overhead=13)

    fit = fit_ceiling(attempt, 0.06, 8176, limit=8176)
    assert fit.attempts > 1 and fit.assembly.n_target_tokens <= 8176
    assert fit.assembly.ceiling_tokens <= 8176


def test_a_prompt_that_cannot_fit_the_context_fails_naming_the_context():
    with pytest.raises(CompressionFailed, match="context left for max_tokens"):
        fit_ceiling(lambda r: fake_assembly(100, join_overhead=12), 0.1, 100, limit=100)


def test_still_over_after_every_attempt_fails_with_counts():
    calls: list[float] = []

    def attempt(r: float) -> Assembly:
        calls.append(r)
        return fake_assembly(5300)

    with pytest.raises(CompressionFailed) as err:
        fit_ceiling(attempt, 0.2, 5253)
    assert err.value.stage == "ceiling"
    assert "final prompt exceeds target-token ceiling (5300 > 5253)" in str(err.value)
    assert len(calls) == 3 + EXTRA_CEILING_ATTEMPTS


def test_overflow_past_half_the_ceiling_stops_without_retry():
    calls: list[float] = []

    def attempt(r: float) -> Assembly:
        calls.append(r)
        return fake_assembly(200)

    with pytest.raises(CompressionFailed, match=r"\(200 > 100\)"):
        fit_ceiling(attempt, 0.5, 100)
    assert calls == [0.5]  # tightened = 100 - 100 - 1 <= 0


def _size_functions():
    """Attempt sizes as a function of r: scaled, noisy, ignoring r, and growing as r falls."""
    scaled = st.builds(
        lambda a, b: lambda r, k: int(a * r) + b,
        st.integers(0, 20_000),
        st.integers(0, 300),
    )
    scripted = st.lists(st.integers(0, 20_000), min_size=9, max_size=9).map(
        lambda xs: lambda r, k: xs[k]
    )
    inverse = st.integers(1, 5_000).map(lambda a: lambda r, k: int(a / max(r, 1e-9)))
    return st.one_of(scaled, scripted, inverse)


TOTAL = 3 + EXTRA_CEILING_ATTEMPTS


@settings(max_examples=300, deadline=None)
@given(
    size=_size_functions(),
    r_requested=st.floats(0.001, 1.0),
    ceiling=st.integers(0, 10_000),
    overhead=st.integers(-5, 50),
)
def test_fit_ceiling_never_returns_a_prompt_over_the_ceiling(size, r_requested, ceiling, overhead):
    calls: list[tuple[float, int]] = []

    def attempt(r: float) -> Assembly:
        counted = max(0, size(r, len(calls)))
        calls.append((r, counted))
        return fake_assembly(counted, join_overhead=max(overhead, -counted))

    try:
        fit = fit_ceiling(attempt, r_requested, ceiling)
    except CompressionFailed as err:
        assert err.stage == "ceiling"
        assert all(counted > ceiling for _, counted in calls)
        last, k = calls[-1][1], len(calls) - 1
        assert (
            len(calls) == TOTAL or ceiling - (last - ceiling) * ceiling_retry_scale(k, 3) - 1 <= 0
        )
        assert f"({last} > {ceiling})" in str(err)
    else:
        assert fit.assembly.ceiling_tokens <= ceiling
        assert fit.attempts == len(calls)
        assert fit.r_used == calls[-1][0]
        assert all(counted > ceiling for _, counted in calls[:-1])
    assert 1 <= len(calls) <= TOTAL
    assert calls[0][0] == r_requested
    for k, ((_, counted), (r_next, _)) in enumerate(zip(calls, calls[1:], strict=False)):
        tightened = ceiling - (counted - ceiling) * ceiling_retry_scale(k, 3) - 1
        assert tightened > 0
        assert r_next == r_requested * tightened / ceiling


def test_a_one_token_overflow_that_retries_cannot_fix_escalates_until_a_chunk_goes():
    # 64-token chunks: lowering r by 1/520 keeps the same chunks, so the reference's three
    # attempts all measured 521 > 520 (a 500 to the client); doubling the overflow drops one
    def attempt(r: float) -> Assembly:
        chunks = int(r * 520 / 0.1 / 64 + 1e-9)  # chunks the budget at r buys
        return fake_assembly(chunks * 64 + 9)  # 8 chunks + a 9-token header = 521

    fit = fit_ceiling(attempt, 0.1, 520)
    assert fit.assembly.ceiling_tokens <= 520 and fit.attempts > 3


# --------------------------------------------------------------------------- recall text

CHATML = {"role_markers": ("<|im_start|>",), "end_markers": ("<|im_end|>",)}


def test_clean_excerpt_removes_markers_and_generic_role_names():
    text = "<|im_start|>user\nWhich band?<|im_end|>\n<|im_start|>assistant\nThe Stones."
    assert clean_excerpt(text, **CHATML, generic_role=True) == "Which band?\n\n\nThe Stones."


def test_clean_excerpt_keeps_role_names_for_non_generic_families():
    text = "<|im_start|>user\nWhich band?<|im_end|>"
    assert clean_excerpt(text, **CHATML, generic_role=False) == "user\nWhich band?"


def test_clean_excerpt_drops_a_role_name_cut_at_the_end_and_keeps_inline_text():
    text = "toured in 1967.<|im_end|>\n<|im_start|>assist"
    assert clean_excerpt(text, **CHATML, generic_role=True) == "toured in 1967."
    inline = "<|im_start|>user Which band?"
    assert clean_excerpt(inline, **CHATML, generic_role=True) == "user Which band?"


def test_clean_excerpt_of_only_markers_is_empty():
    assert clean_excerpt("<|im_end|>\n<|im_start|>user\n", **CHATML, generic_role=True) == ""


def test_recall_block_layout_skips_empty_excerpts():
    block = recall_block(["first excerpt", "", "  ", "second excerpt"])
    assert block == (
        "[Earlier in this conversation]\nfirst excerpt\n\nsecond excerpt\n"
        "[End of earlier excerpts]\n\n"
    )
    assert recall_block(["", " \n"]) == ""


def test_recall_text_decodes_and_cleans_drafter_spans(smollm2_tokenizer):
    tok = encode_as_written_with_offsets(smollm2_tokenizer, CHAT)
    first = CHAT.index("Document 1")
    third = CHAT.index("Document 3")
    spans = [
        tok.token_span(first, CHAT.index(" Document 2")),
        tok.token_span(third, CHAT.index("\n\nWhich")),
        tok.token_span(CHAT.index("<|im_end|>\n<|im_start|>assistant"), len(CHAT)),
    ]
    block = recall_text(smollm2_tokenizer, tok.ids, spans, **CHATML, generic_role=True)
    assert block == (
        "[Earlier in this conversation]\n"
        "Document 1: The Rolling Stones toured Europe in 1967 with other bands.\n\n"
        "Document 3: 東京 hosted the final concert of the season, and the crowd sang along.\n"
        "[End of earlier excerpts]\n\n"
    )
