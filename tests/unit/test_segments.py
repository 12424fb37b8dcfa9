"""Fixed chunk grid, chunk schedule and probe segmentation (ALGORITHM.md §4.3, §4.7, §10.1
items 16 and 19). All spans are drafter tokens."""

from __future__ import annotations

import numpy as np
import pytest

from pflash.compress.plan.segments import (
    ProbeParams,
    count_probe_boundaries,
    fixed_grid,
    probe_cuts,
    required_grid_tokens,
    scheduled_chunk_size,
    segment,
    smooth_boundary_logits,
    split_oversize,
    structurally_required,
)
from pflash.config import build_config
from pflash.errors import CompressionFailed
from pflash.spans import Span

# --------------------------------------------------------------------------- schedule and grid


@pytest.mark.parametrize(("n_tokens", "chunk"), [(499, 128), (500, 512), (2999, 512), (3000, 1024)])
def test_chunk_schedule_boundaries(n_tokens, chunk):
    assert scheduled_chunk_size(n_tokens) == chunk


def test_explicit_chunk_size_overrides_schedule():
    config = build_config({}, env={"PFLASH_SELECT_CHUNK_SIZE": "256"})
    assert scheduled_chunk_size(3000, config.select_chunk_size) == 256
    assert scheduled_chunk_size(100, config.select_chunk_size) == 256


def test_fixed_grid_last_chunk_is_short():
    begin, end = fixed_grid(101, 32)
    assert begin.tolist() == [0, 32, 64, 96]
    assert end.tolist() == [32, 64, 96, 101]


def test_structural_suffix_chunk_is_mandatory():
    """§4.4: S=101, query [80, 90): [0,64) optional, [64,96) overlaps the query, [96,101) is
    the structural suffix."""
    req = structurally_required(
        np.array([0, 64, 96]),
        np.array([64, 96, 101]),
        query=Span(80, 90),
        pinned=(),
        suffix_candidates=False,
    )
    assert req.tolist() == [False, True, True]


def test_suffix_candidates_leave_chunks_after_query_optional_but_pins_mandatory():
    begin, end = fixed_grid(256, 32)
    req = structurally_required(
        begin, end, query=Span(90, 100), pinned=(Span(190, 200),), suffix_candidates=True
    )
    assert np.flatnonzero(req).tolist() == [2, 3, 5, 6]


def test_pinned_span_overlap_is_exact_at_edges():
    begin, end = fixed_grid(96, 32)
    req = structurally_required(
        begin, end, query=Span(95, 96), pinned=(Span(32, 33), Span(63, 64)), suffix_candidates=True
    )
    # [32,33) and [63,64) both lie in chunk 1; chunk 0 ends at 32 so does not overlap
    assert req.tolist() == [False, True, True]


def test_required_grid_tokens_counts_mandatory_chunk_lengths():
    k = required_grid_tokens(
        101, 32, query=Span(80, 90), pinned=(Span(0, 3),), suffix_candidates=False
    )
    assert k == 32 + 32 + 5  # chunk 0 (pin), chunk 2 (query), chunk 3 (suffix, 5 tokens)


# --------------------------------------------------------------------------- probe smoothing


def test_smooth_boundary_logits_matches_conv_with_residual():
    raw = np.array([0.5, -1.0, 2.0, 0.0, 1.5, -0.5, 3.0], dtype=np.float32)
    w = np.array([0.1, -0.2, 0.3, 0.4, 0.05])
    b = -0.25
    r = 2
    expect = []
    for t in range(raw.size):
        acc = raw[t] + b
        for k in range(w.size):
            j = t + k - r
            if 0 <= j < raw.size:
                acc += w[k] * raw[j]
        expect.append(1.0 / (1.0 + np.exp(-acc)))
    got = smooth_boundary_logits(raw, w, b)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expect, rtol=1e-6)


def test_smooth_boundary_logits_is_stable_for_large_logits():
    got = smooth_boundary_logits(np.array([800.0, -800.0, 0.0]), np.array([0.0]), 0.0)
    assert got.tolist() == [1.0, 0.0, 0.5]


def test_smooth_boundary_logits_rejects_even_taps():
    with pytest.raises(ValueError, match="odd"):
        smooth_boundary_logits(np.zeros(4), np.zeros(4), 0.0)


# --------------------------------------------------------------------------- probe cuts (item 19)

PARAMS = ProbeParams(threshold=0.9, min_segment=1, max_segment=2048)


def test_probe_cuts_only_strictly_above_threshold():
    b = np.zeros(20, dtype=np.float32)
    b[5] = np.float32(0.9)  # equal: not a cut
    b[10] = np.float32(0.91)
    b[15] = np.nan  # non-finite: never a cut
    assert probe_cuts(b, PARAMS).tolist() == [0, 10, 20]


def test_probe_cut_at_token_zero_is_ignored():
    b = np.zeros(8)
    b[0] = 1.0
    assert probe_cuts(b, PARAMS).tolist() == [0, 8]


def test_min_segment_drops_non_forced_cuts():
    b = np.zeros(20)
    b[[3, 5, 9, 11]] = 0.95
    params = ProbeParams(0.9, min_segment=4, max_segment=2048)
    # 3 is too close to 0; 5 is 5 after 0; 9 is 4 after 5; 11 is 2 after 9
    assert probe_cuts(b, params).tolist() == [0, 5, 9, 20]


def test_forced_cuts_survive_min_segment():
    b = np.zeros(20)
    b[5] = 0.95
    params = ProbeParams(0.9, min_segment=4, max_segment=2048)
    # forced 2 is kept although 2 < min_segment; the free cut at 5 is then only 3 after it
    assert probe_cuts(b, params, forced_cuts=[2, 17, 0, 20, 25]).tolist() == [0, 2, 17, 20]


def test_oversize_split_respects_edge_guard():
    interior = np.zeros(100)
    interior[15] = 0.8  # best score, but before the guarded window [20, 40]
    interior[30] = 0.5
    interior[95] = 0.9  # within min_segment of the end: never a split point
    params = ProbeParams(0.9, min_segment=10, max_segment=40)
    begin, end = split_oversize(np.array([0, 100]), params, interior)
    # [0,100): window [max(10, 20), min(90, 40)] -> best 30; [30,100): window [50, 70] has no
    # positive score -> 30 + 40 = 70; [70,100) fits
    assert list(zip(begin.tolist(), end.tolist(), strict=True)) == [(0, 30), (30, 70), (70, 100)]


def test_oversize_split_takes_first_of_equal_best_scores():
    interior = np.zeros(50)
    interior[[22, 25]] = 0.7
    params = ProbeParams(0.9, min_segment=1, max_segment=30)
    begin, end = split_oversize(np.array([0, 50]), params, interior)
    assert end.tolist() == [22, 50]


def test_subunit_scores_are_used_only_for_the_interior_split():
    n = 120
    unit = np.zeros(n)
    unit[40] = 0.95  # a real boundary
    unit[70] = 0.85  # below threshold: no cut; would be the unit's interior argmax
    sub = np.zeros(n)
    sub[60] = 0.99  # above threshold, but sub-unit scores never make cuts
    sub[90] = 0.6
    params = ProbeParams(0.9, min_segment=1, max_segment=64)
    seg = segment(
        n,
        mode="probe",
        chunk_size=128,
        query=Span(119, 120),
        pinned=(),
        suffix_candidates=False,
        boundary=unit,
        subunit=sub,
        params=params,
    )
    # cuts: 0, 40 (unit), 119 (query begin), 120; [40,119) is 79 > 64: window [72, 104] in
    # the sub-unit scores -> 90 (the sub-unit's 60 is outside it, the unit's 70 is not used)
    assert seg.spans() == (Span(0, 40), Span(40, 90), Span(90, 119), Span(119, 120))
    without_sub = segment(
        n,
        mode="probe",
        chunk_size=128,
        query=Span(119, 120),
        pinned=(),
        suffix_candidates=False,
        boundary=unit,
        params=params,
    )
    # with the unit scores only, nothing in [72, 104] is positive -> 40 + 64 = 104
    assert without_sub.spans() == (Span(0, 40), Span(40, 104), Span(104, 119), Span(119, 120))


def test_probe_segments_force_cuts_at_query_and_pinned_edges():
    b = np.zeros(64)
    b[[8, 16, 24, 32]] = 0.99
    seg = segment(
        64,
        mode="auto",
        chunk_size=32,
        query=Span(50, 60),
        pinned=(Span(2, 5),),
        suffix_candidates=False,
        boundary=b,
        params=PARAMS,
    )
    assert seg.kind == "probe"
    assert seg.chunk_size == 0
    assert seg.begin.tolist() == [0, 2, 5, 8, 16, 24, 32, 50, 60]
    assert seg.end.tolist() == [2, 5, 8, 16, 24, 32, 50, 60, 64]


# --------------------------------------------------------------------------- probe gate


def test_gate_counts_boundaries_before_query_only():
    b = np.zeros(100)
    b[[0, 10, 20, 60, 85, 95]] = 0.95  # t=0 never counts
    q = Span(80, 90)
    assert count_probe_boundaries(b, 0.9, query=q, suffix_candidates=False) == 3
    # with suffix candidates only the query window itself is excluded
    assert count_probe_boundaries(b, 0.9, query=q, suffix_candidates=True) == 4


def test_auto_falls_back_to_fixed_chunks_below_four_boundaries():
    b = np.zeros(200)
    b[[10, 20, 30]] = 0.95
    seg = segment(
        200,
        mode="auto",
        chunk_size=64,
        query=Span(190, 200),
        pinned=(),
        suffix_candidates=False,
        boundary=b,
        params=PARAMS,
    )
    assert seg.kind == "fixed"
    assert seg.boundaries == 3
    assert seg.fallback == "probe found 3 boundaries (< 4)"
    assert seg.begin.tolist() == [0, 64, 128, 192]


def test_auto_uses_probe_at_four_boundaries():
    b = np.zeros(200)
    b[[10, 20, 30, 40]] = 0.95
    seg = segment(
        200,
        mode="auto",
        chunk_size=64,
        query=Span(190, 200),
        pinned=(),
        suffix_candidates=False,
        boundary=b,
        params=PARAMS,
    )
    assert seg.kind == "probe"
    assert seg.boundaries == 4


def test_segments_probe_uses_probe_even_with_few_boundaries():
    b = np.zeros(50)
    b[20] = 0.95
    seg = segment(
        50,
        mode="probe",
        chunk_size=32,
        query=Span(49, 50),
        pinned=(),
        suffix_candidates=False,
        boundary=b,
        params=PARAMS,
    )
    assert seg.kind == "probe"
    assert seg.spans() == (Span(0, 20), Span(20, 49), Span(49, 50))


def test_segments_fixed_ignores_the_probe():
    b = np.full(50, 0.99)
    seg = segment(
        50,
        mode="fixed",
        chunk_size=32,
        query=Span(49, 50),
        pinned=(),
        suffix_candidates=False,
        boundary=b,
        params=PARAMS,
    )
    assert seg.kind == "fixed"
    assert seg.spans() == (Span(0, 32), Span(32, 50))


def test_auto_without_probe_uses_fixed_chunks():
    seg = segment(
        50, mode="auto", chunk_size=32, query=Span(49, 50), pinned=(), suffix_candidates=False
    )
    assert seg.kind == "fixed"
    assert seg.fallback == "no segment probe"


def test_segments_probe_without_probe_output_fails_closed():
    with pytest.raises(CompressionFailed) as err:
        segment(
            50, mode="probe", chunk_size=32, query=Span(49, 50), pinned=(), suffix_candidates=False
        )
    assert err.value.stage == "probe"


def test_probe_params_are_validated():
    with pytest.raises(ValueError, match="threshold"):
        ProbeParams(1.0, 1, 10)
    with pytest.raises(ValueError, match="min_segment"):
        ProbeParams(0.5, 0, 10)
    with pytest.raises(ValueError, match="max_segment"):
        ProbeParams(0.5, 8, 4)
