"""Strict, split and top_k selection and the selection configuration (ALGORITHM.md §4.3-§4.6,
§10.1 items 1-17 and 20-23, with the reference's numbers). Spans are drafter tokens."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pflash.compress.plan.segments import fixed_grid, structurally_required
from pflash.compress.selection import (
    Candidates,
    build_candidates,
    kept_spans,
    promote_spans,
    resolve_score_kind,
    select_candidates,
    select_split,
    span_sums,
    split_candidates,
)
from pflash.config import build_config
from pflash.errors import ConfigError
from pflash.spans import Span, validate_spans

# --------------------------------------------------------------------------- items 1-3


def test_structural_suffix_chunks_are_charged_first():
    """Item 1: [0,64) optional, [64,96) and [96,101) mandatory (32 + 5 tokens); budget 37."""
    q = Span(80, 90)
    begin, end = np.array([0, 64, 96]), np.array([64, 96, 101])
    mandatory = structurally_required(begin, end, query=q, pinned=(), suffix_candidates=False)
    cands = Candidates.of([(0, 64), (64, 96), (96, 101)], [100.0, 0.0, 0.0], mandatory)
    result = select_candidates(cands, budget=37, mode="budget_only")
    assert result.ok
    assert result.ordinals == (1, 2)
    assert result.retained_tokens == 37
    assert result.stop_reason == "budget_reached"


def test_suffix_candidates_make_chunks_after_query_optional_pins_stay_mandatory():
    """Item 2: with query_suffix_candidates a chunk after the query is scored, not kept;
    a pinned span after the query ([190,200)) is still mandatory."""
    token_scores = np.zeros(256)
    token_scores[128:160] = 1.0  # chunk 4, after the query, scores highest
    grid = fixed_grid(256, 32)
    common = dict(query=Span(90, 100), pinned=(Span(190, 200),), kind="sum")
    agent = build_candidates(grid, token_scores, suffix_candidates=True, **common)
    assert np.flatnonzero(agent.mandatory).tolist() == [2, 3, 5, 6]
    result = select_candidates(agent, budget=5 * 32)
    assert result.ordinals == (2, 3, 4, 5, 6)
    chat = build_candidates(grid, token_scores, suffix_candidates=False, **common)
    assert np.flatnonzero(chat.mandatory).tolist() == [2, 3, 4, 5, 6, 7]


def test_instruction_overlap_is_mandatory_and_fill_stops_at_a_big_chunk():
    """Item 3: pins [0,384) and [4096,4352) over S=120000 with 1024-token chunks, query
    [119872, 120000); budget 3200 -> {0,1,3,4}, the fill stops at chunk 2 (no skipping)."""
    pins = (Span(0, 384), Span(4096, 4352))
    q = Span(119872, 120000)
    spans = [(0, 1024), (1024, 2048), (2048, 3072), (4096, 5120), (119872, 120000)]
    begin = np.array([s[0] for s in spans])
    end = np.array([s[1] for s in spans])
    mandatory = structurally_required(begin, end, query=q, pinned=pins, suffix_candidates=False)
    assert mandatory.tolist() == [True, False, False, True, True]
    cands = Candidates.of(spans, [0.0, 10.0, 1.0, 0.0, 0.0], mandatory)
    result = select_candidates(cands, budget=3200)
    assert result.ok
    assert result.ordinals == (0, 1, 3, 4)
    assert result.retained_tokens == 3200
    assert result.stop_reason == "budget_reached"


# --------------------------------------------------------------------------- item 4


@pytest.mark.parametrize(
    "spans",
    [
        [Span(-1, 2)],
        [Span(4, 4)],
        [Span(4, 3)],
        [Span(0, 4), Span(3, 6)],
        [Span(8, 12), Span(0, 4)],
        [Span(0, 33)],
        [Span(i, i + 1) for i in range(65)],
    ],
    ids=["negative", "empty", "reversed", "overlapping", "unordered", "beyond", "65 spans"],
)
def test_invalid_instruction_spans_are_rejected(spans):
    assert validate_spans(spans, 100 if len(spans) == 65 else 32) is not None


# --------------------------------------------------------------------------- items 5-8


def test_top_p_is_scale_invariant_and_keeps_the_crossing_candidate():
    """Item 5: scores 6, 3, 1 and top_p 0.8 -> {0,1}, mass 0.9, for any score scale."""
    spans = [(0, 4), (4, 8), (8, 12)]
    for scale in (1.0, 100.0):
        cands = Candidates.of(spans, np.array([6.0, 3.0, 1.0]) * scale)
        result = select_candidates(cands, budget=12, mode="top_p", top_p=0.8)
        assert result.ordinals == (0, 1)
        assert result.stop_reason == "top_p_reached"
        assert result.retained_mass == pytest.approx(0.9, abs=1e-12)


def test_non_positive_scores_share_mass_equally_and_tie_by_ordinal():
    """Item 6: scores -8, -2, 0 -> 1/3 each; ties go to the lower ordinal; top_p 0.5 -> {0,1}."""
    cands = Candidates.of([(8, 12), (0, 4), (4, 8)], [-8.0, -2.0, 0.0], ordinals=[2, 0, 1])
    result = select_candidates(cands, budget=12, mode="top_p", top_p=0.5)
    assert result.ordinals == (0, 1)
    assert result.stop_reason == "top_p_reached"
    assert result.retained_mass == pytest.approx(2 / 3, abs=1e-12)


def test_budget_only_keeps_everything_that_fits_with_full_mass():
    """Item 7: budget_only ignores top_p; all three fit -> mass 1.0, candidates_exhausted."""
    cands = Candidates.of([(0, 4), (4, 8), (8, 12)], [6.0, 3.0, 1.0])
    result = select_candidates(cands, budget=12, mode="budget_only", top_p=0.1)
    assert result.ordinals == (0, 1, 2)
    assert result.retained_tokens == 12
    assert result.stop_reason == "candidates_exhausted"
    assert result.retained_mass == pytest.approx(1.0, abs=1e-12)


def test_mandatory_scores_do_not_enter_the_mass():
    """Item 8: a huge mandatory score does not dilute the optional mass."""
    cands = Candidates.of(
        [(0, 1), (1, 2), (2, 3), (3, 4)], [1e30, 6.0, 3.0, 1.0], [True, False, False, False]
    )
    result = select_candidates(cands, budget=4, mode="top_p", top_p=0.8)
    assert result.ordinals == (0, 1, 2)
    assert result.stop_reason == "top_p_reached"
    assert result.retained_mass == pytest.approx(0.9, abs=1e-12)


def test_short_final_chunk_is_charged_its_real_length():
    cands = Candidates.of([(0, 4), (4, 6)], [2.0, 1.0])
    result = select_candidates(cands, budget=6, top_p=1.0)
    assert result.ordinals == (0, 1)
    assert result.retained_tokens == 6
    assert result.stop_reason == "candidates_exhausted"


# --------------------------------------------------------------------------- items 9-12


def test_mandatory_query_over_budget_fails():
    """Item 9: mandatory overflow -> ok=false, its own stop reason, nothing kept."""
    cands = Candidates.of([(0, 4), (4, 6)], [0.0, 1.0], [True, False])
    result = select_candidates(cands, budget=3, mode="top_p")
    assert not result.ok
    assert result.stop_reason == "mandatory_query_exceeds_budget"
    assert result.ordinals == ()
    assert result.retained_tokens == 0
    assert "exceed the token budget 3" in result.error


def test_budget_stop_does_not_skip_to_a_smaller_later_candidate():
    """Item 10: with fixed chunks the 4-token candidate that misses stops the fill even though
    the 3-token one after it would fit."""
    cands = Candidates.of([(0, 2), (2, 6), (6, 9)], [0.0, 10.0, 1.0], [True, False, False])
    result = select_candidates(cands, budget=5, top_p=1.0)
    assert result.ordinals == (0,)
    assert result.retained_tokens == 2
    assert result.stop_reason == "budget_reached"


def test_output_ordinals_are_in_source_order():
    """Item 11."""
    cands = Candidates.of(
        [(8, 12), (0, 4), (4, 8)], [10.0, 1.0, 99.0], [False, False, True], ordinals=[42, 7, 99]
    )
    result = select_candidates(cands, budget=12, top_p=1.0)
    assert result.ordinals == (7, 99, 42)


@pytest.mark.parametrize(
    ("spans", "scores", "ordinals", "budget", "top_p", "message"),
    [
        ([(0, 4)], [float("nan")], None, 16, 0.95, "finite"),
        ([(0, 4)], [float("inf")], None, 16, 0.95, "finite"),
        ([(0, 4), (3, 6)], [1.0, 2.0], None, 16, 0.95, "overlap"),
        ([(0, 4), (4, 8)], [1.0, 2.0], [0, 0], 16, 0.95, "unique"),
        ([(0, 4)], [1.0], None, 0, 0.95, "budget"),
        ([(0, 4)], [1.0], None, 1, 0.0, "top_p"),
        ([(0, 4)], [1.0], None, 1, 1.01, "top_p"),
        ([(0, 4)], [1.0], None, 1, float("nan"), "top_p"),
        ([(-1, 4)], [1.0], None, 16, 0.95, "range"),
        ([(4, 4)], [1.0], None, 16, 0.95, "range"),
    ],
)
def test_invalid_selector_inputs_fail_closed(spans, scores, ordinals, budget, top_p, message):
    """Item 12: NaN/inf score, overlap, duplicate ordinal, budget <= 0, top_p 0 or > 1."""
    cands = Candidates.of(spans, scores, ordinals=ordinals)
    result = select_candidates(cands, budget=budget, mode="top_p", top_p=top_p)
    assert not result.ok
    assert result.stop_reason == "invalid_input"
    assert result.ordinals == ()
    assert message in result.error


def test_legacy_mode_is_invalid_for_the_strict_selector():
    result = select_candidates(Candidates.of([(0, 4)], [1.0]), budget=4, mode="legacy")
    assert not result.ok
    assert result.stop_reason == "invalid_input"


def test_no_candidates_is_exhausted_not_an_error():
    result = select_candidates(Candidates.of([], []), budget=4)
    assert result.ok
    assert result.stop_reason == "candidates_exhausted"
    assert result.retained_tokens == 0


# --------------------------------------------------------------------------- items 13-17: config


def test_selection_defaults_without_environment():
    """Item 13, with the product's deliberate difference: the reference defaults to the
    legacy selector (mode Legacy, chunk 32, strict inactive); our product default is strict
    budget_only with 64-token chunks (the reference's schedule by length with
    select_chunk_size unset). Parser, query width and top_p match; the legacy selector's
    chunk stays 32."""
    config = build_config({}, env={})
    assert config.select_mode == "budget_only"
    assert config.strict
    assert config.select_query_parser == "arbitrary_tail"
    assert config.select_chunk_size == 64
    assert config.legacy_chunk_size == 32
    assert config.select_query_tokens == 8
    assert config.select_top_p == 0.95


def test_chunk_and_query_environment_without_mode_apply_their_values():
    """Item 14: chunk/query env without a mode take effect (the reference stays inactive
    there; our default mode is already strict budget_only)."""
    config = build_config(
        {}, env={"PFLASH_SELECT_CHUNK_SIZE": "64", "PFLASH_SELECT_QUERY_TOKENS": "32"}
    )
    assert config.select_mode == "budget_only"
    assert config.select_chunk_size == 64
    assert config.select_query_tokens == 32


@pytest.mark.parametrize(
    "key", ["PFLASH_SELECT_MODE", "PFLASH_SELECT_QUERY_TOKENS", "PFLASH_SELECT_TOP_P"]
)
def test_empty_environment_value_is_an_error(key):
    """Item 15: an empty value is present, then fails validation."""
    with pytest.raises(ConfigError, match="set but empty"):
        build_config({}, env={key: ""})


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("PFLASH_SELECT_MODE", "TOP_P"),
        ("PFLASH_SELECT_CHUNK_SIZE", "0"),
        ("PFLASH_SELECT_CHUNK_SIZE", "12x"),
        ("PFLASH_SELECT_QUERY_TOKENS", "0"),
        ("PFLASH_SELECT_QUERY_TOKENS", "513"),
        ("PFLASH_SELECT_QUERY_PARSER", "last_128"),
        ("PFLASH_SELECT_TOP_P", "0"),
        ("PFLASH_SELECT_TOP_P", "1.01"),
        ("PFLASH_SELECT_TOP_P", "nan"),
    ],
)
def test_invalid_selection_environment_values_are_rejected(key, value):
    """Item 17. (Mode "legacy" is rejected by the reference resolver but is our opt-in
    legacy selector, so it is valid here.)"""
    with pytest.raises(ConfigError) as err:
        build_config({}, env={key: value})
    assert err.value.key == key.removeprefix("PFLASH_").lower()


def test_top_p_one_and_legacy_mode_are_valid():
    assert build_config({}, env={"PFLASH_SELECT_TOP_P": "1"}).select_top_p == 1.0
    assert not build_config({}, env={"PFLASH_SELECT_MODE": "legacy"}).strict


# --------------------------------------------------------------------------- sum / density


def test_auto_score_is_sum_on_fixed_chunks_and_density_on_probe_segments():
    assert resolve_score_kind("auto", "fixed", "head") == "sum"
    assert resolve_score_kind("auto", "probe", "head") == "density"
    assert resolve_score_kind("density", "fixed", "head") == "density"
    assert resolve_score_kind("sum", "probe", "head") == "sum"
    assert resolve_score_kind("sum", "fixed", "legacy") == "density"


def test_sum_ranks_a_full_chunk_above_a_short_dense_tail():
    mass = np.full(40, 0.01, dtype=np.float32)
    mass[32:40] = 0.02  # short last chunk, denser
    grid = fixed_grid(40, 32)
    common = dict(query=Span(0, 0), pinned=(), suffix_candidates=True)
    by_sum = build_candidates(grid, mass, kind="sum", **common)
    by_density = build_candidates(grid, mass, kind="density", **common)
    assert by_sum.score.tolist() == pytest.approx([0.32, 0.16])
    assert by_density.score.tolist() == pytest.approx([0.01, 0.02])


def test_equal_chunks_get_bit_identical_sums():
    values = np.tile(np.float32([0.1, 0.3, 0.7]), 1000)
    sums = span_sums(values, np.array([0, 300, 1500]), np.array([300, 600, 1800]))
    assert sums[0] == sums[1] == sums[2]


# --------------------------------------------------------------------------- item 20


def test_skip_oversized_reaches_smaller_probe_segments():
    """Item 20: segments 600/200/200, budget 500: strict keeps nothing (budget_reached);
    skipping keeps {1,2} = 400 tokens."""
    cands = Candidates.of([(0, 600), (600, 800), (800, 1000)], [3.0, 2.0, 1.0])
    strict = select_candidates(cands, budget=500)
    assert strict.ok
    assert strict.ordinals == ()
    assert strict.stop_reason == "budget_reached"
    skipping = select_candidates(cands, budget=500, skip_oversized=True)
    assert skipping.ordinals == (1, 2)
    assert skipping.retained_tokens == 400
    assert skipping.stop_reason == "budget_reached"


# --------------------------------------------------------------------------- item 21: split


def _six_hundreds() -> tuple[Candidates, np.ndarray]:
    spans = [(100 * i, 100 * (i + 1)) for i in range(6)]
    mandatory = [i == 2 for i in range(6)]
    head = Candidates.of(spans, [6.0, 5.0, 4.0, 3.0, 2.0, 1.0], mandatory)
    return head, np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])


def test_split_gives_the_head_its_share_then_the_legacy_scorer_the_rest():
    head, legacy = _six_hundreds()
    result = select_split(head, legacy, budget=400, fraction=0.5)
    assert result.ok
    assert result.ordinals == (0, 2, 4, 5)
    assert result.retained_tokens == 400


def test_split_head_budget_never_drops_below_the_mandatory_tokens():
    head, legacy = _six_hundreds()
    result = select_split(head, legacy, budget=300, fraction=0.01)
    assert result.ordinals == (2, 4, 5)
    assert result.retained_mass == 0.0  # pass 1 kept only the mandatory chunk


def test_split_refuses_top_k():
    head, legacy = _six_hundreds()
    result = select_split(head, legacy, budget=400, fraction=0.5, mode="top_k", top_k=2)
    assert not result.ok
    assert result.stop_reason == "invalid_input"
    assert "top_k" in result.error


def test_split_config_refuses_top_k():
    with pytest.raises(ConfigError, match="split"):
        build_config(
            {},
            env={
                "PFLASH_SELECT_MODE": "top_k",
                "PFLASH_SELECT_TOPK": "2",
                "PFLASH_SELECT_SCORER": "split",
            },
        )


def test_split_reports_the_head_mass_and_the_second_stop():
    head, legacy = _six_hundreds()
    result = select_split(head, legacy, budget=600, fraction=0.5)
    # pass 1 (budget 300): mandatory 2, then 0 and 1 (head mass (6+5)/(6+5+3+2+1))
    assert result.retained_mass == pytest.approx(11 / 17)
    # pass 2 (budget 300): 5, 4, 3 by legacy score, all fit
    assert result.ordinals == (0, 1, 2, 3, 4, 5)
    assert result.stop_reason == "candidates_exhausted"


# --------------------------------------------------------------------------- item 22: top_k


def _four() -> Candidates:
    return Candidates.of([(0, 4), (4, 8), (8, 12), (12, 16)], [4.0, 3.0, 2.0, 1.0])


def test_top_k_keeps_k_optional_candidates():
    result = select_candidates(_four(), budget=16, mode="top_k", top_k=2)
    assert result.ordinals == (0, 1)
    assert result.stop_reason == "top_k_reached"


def test_top_k_larger_than_candidates_exhausts_them():
    result = select_candidates(_four(), budget=16, mode="top_k", top_k=9)
    assert result.ordinals == (0, 1, 2, 3)
    assert result.stop_reason == "candidates_exhausted"


def test_top_k_with_binding_budget_stops_at_budget():
    result = select_candidates(_four(), budget=6, mode="top_k", top_k=3)
    assert result.ordinals == (0,)
    assert result.stop_reason == "budget_reached"


def test_top_k_with_skip_oversized_keeps_k_that_fit():
    cands = Candidates.of([(0, 10), (10, 12), (12, 14), (14, 16)], [4.0, 3.0, 2.0, 1.0])
    result = select_candidates(cands, budget=6, mode="top_k", top_k=2, skip_oversized=True)
    assert result.ordinals == (1, 2)
    assert result.stop_reason == "top_k_reached"


def test_mandatory_candidates_do_not_count_toward_k():
    cands = Candidates.of(
        [(0, 4), (4, 8), (8, 12), (12, 16)], [0.0, 3.0, 2.0, 1.0], [True, False, False, False]
    )
    result = select_candidates(cands, budget=16, mode="top_k", top_k=2)
    assert result.ordinals == (0, 1, 2)


@pytest.mark.parametrize("k", [0, -1])
def test_top_k_must_be_positive(k):
    result = select_candidates(_four(), budget=16, mode="top_k", top_k=k)
    assert not result.ok
    assert result.stop_reason == "invalid_input"


def test_top_k_mode_requires_topk_in_config():
    with pytest.raises(ConfigError, match="select_topk"):
        build_config({}, env={"PFLASH_SELECT_MODE": "top_k"})
    assert (
        build_config({}, env={"PFLASH_SELECT_MODE": "top_k", "PFLASH_SELECT_TOPK": "3"}).select_topk
        == 3
    )


# --------------------------------------------------------------------------- kept spans


def test_kept_spans_merge_adjacent_candidates():
    cands = _four()
    assert kept_spans(cands, (0, 1, 3)) == (Span(0, 8), Span(12, 16))


def test_kept_spans_reject_unknown_ordinals():
    with pytest.raises(ValueError, match="ordinal"):
        kept_spans(_four(), (7,))


# --------------------------------------------------------------------------- lexical promotion


def _grid(n: int, chunk: int, query: Span) -> tuple[Candidates, np.ndarray]:
    """Fixed-grid candidates over n drafter tokens with per-token scores 0..n-1."""
    scores = np.arange(n, dtype=np.float32)
    begin, end = fixed_grid(n, chunk)
    cands = build_candidates(
        (begin, end), scores, query=query, pinned=(), suffix_candidates=False, kind="sum"
    )
    return cands, scores


def test_split_candidates_cuts_optional_candidates_at_unit_edges_and_keeps_mandatory_whole():
    cands, scores = _grid(200, 64, Span(190, 200))
    out = split_candidates(cands, [10, 20, 150, 170, 64], scores, kind="sum")
    assert out.spans() == (
        Span(0, 10),
        Span(10, 20),
        Span(20, 64),
        Span(64, 128),
        Span(128, 192),  # overlaps the query: mandatory, never cut
        Span(192, 200),
    )
    assert out.mandatory.tolist() == [False, False, False, False, True, True]
    assert out.ordinal.tolist() == [0, 1, 2, 3, 4, 5]
    assert out.score.tolist() == [
        float(sum(range(b, e))) for b, e in [s.as_list() for s in out.spans()]
    ]
    dense = split_candidates(cands, [10], scores, kind="density")
    assert dense.score[0] == pytest.approx(4.5) and dense.score[1] == pytest.approx(36.5)


def test_split_candidates_skips_cuts_that_would_leave_a_sliver():
    cands, scores = _grid(200, 64, Span(190, 200))
    # 2 from the chunk's start, 3 after the cut before, 2 before the chunk's end: skipped
    out = split_candidates(cands, [2, 30, 33, 62, 100], scores, kind="density", min_piece=4)
    assert out.spans()[:4] == (Span(0, 30), Span(30, 64), Span(64, 100), Span(100, 128))
    assert all(len(s) >= 4 for s in out.spans())


def test_split_candidates_without_interior_cuts_returns_the_same_candidates():
    cands, scores = _grid(200, 64, Span(190, 200))
    assert split_candidates(cands, [0, 64, 128, 195], scores, kind="sum") is cands


def test_promotion_skips_a_span_that_does_not_fit_and_takes_the_next():
    cands = Candidates.of([(0, 10), (10, 40), (40, 50), (50, 60)], [0, 0, 0, 0], [0, 0, 0, 1])
    out, promoted = promote_spans(cands, [Span(10, 40), Span(42, 48)], budget=30)
    # 20 tokens droppable: the 30-token span does not fit, the 10-token one does
    assert promoted == 1
    assert out.mandatory.tolist() == [False, False, True, True]
    sel = select_candidates(out, budget=30)
    assert sel.ok and 2 in sel.ordinals and sel.retained_tokens <= 30


def test_promotion_share_limits_the_promoted_tokens():
    cands = Candidates.of([(i, i + 10) for i in range(0, 100, 10)], [0.0] * 10)
    spans = [Span(i, i + 10) for i in range(0, 100, 10)]
    _, full = promote_spans(cands, spans, budget=60)
    _, half = promote_spans(cands, spans, budget=60, share=0.5)
    assert (full, half) == (6, 3)


def test_promotion_is_a_no_op_when_mandatory_fills_the_budget():
    cands = Candidates.of([(0, 10), (10, 20)], [1.0, 1.0], [False, True])
    out, promoted = promote_spans(cands, [Span(0, 10)], budget=10)
    assert promoted == 0 and out is cands


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=30),
    data=st.data(),
)
def test_promotion_never_breaks_the_budget(lengths, data):
    edges = np.concatenate(([0], np.cumsum(lengths)))
    n = len(lengths)
    mandatory = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    cands = Candidates.of(list(zip(edges[:-1], edges[1:], strict=True)), [1.0] * n, mandatory)
    total = int(edges[-1])
    spans = data.draw(
        st.lists(
            st.tuples(st.integers(0, total - 1), st.integers(1, 40)).map(
                lambda t: Span(t[0], min(total, t[0] + t[1]))
            ),
            max_size=40,
        )
    )
    budget = data.draw(st.integers(1, total))
    share = data.draw(st.sampled_from([0.25, 0.5, 1.0]))
    must = int(cands.lengths[cands.mandatory].sum())
    out, promoted = promote_spans(cands, spans, budget=budget, share=share)
    added = int(out.lengths[out.mandatory].sum()) - must
    assert 0 <= added <= max(0, share * (budget - must))
    assert promoted <= len(spans)
    assert np.all(out.mandatory[cands.mandatory])  # nothing mandatory is released
    if must <= budget:
        sel = select_candidates(out, budget=budget)
        assert sel.ok and sel.retained_tokens <= budget
