"""Properties of selection over random inputs (hypothesis), and agreement of the vectorised
selectors with plain one-candidate-at-a-time models written from ALGORITHM.md §4.1, §4.5, §4.7.
Spans are drafter tokens."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pflash.compress.plan.budget import plan_budget
from pflash.compress.plan.segments import ProbeParams, fixed_grid, probe_cuts, split_oversize
from pflash.compress.selection import (
    Candidates,
    anchor_chunks,
    build_candidates,
    kept_spans,
    select_candidates,
)
from pflash.spans import Span

MODES = st.sampled_from(["budget_only", "top_p", "top_k"])


@st.composite
def candidate_sets(draw):
    """Tiling candidates over [0, S) with random lengths, scores and mandatory flags."""
    lengths = draw(st.lists(st.integers(1, 40), min_size=0, max_size=25))
    edges = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    n = len(lengths)
    scores = draw(
        st.lists(
            st.one_of(st.floats(-5, 100, allow_nan=False), st.sampled_from([0.0, 1.0, 2.0])),
            min_size=n,
            max_size=n,
        )
    )
    mandatory = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    perm = draw(st.permutations(range(n)))
    cands = Candidates(
        edges[:-1][perm].copy(),
        edges[1:][perm].copy(),
        np.asarray(scores, dtype=np.float64)[perm],
        np.asarray(mandatory, dtype=bool)[perm],
        np.asarray(perm, dtype=np.int64) * 3 + 1,  # ordinals need not be indices
    )
    return cands, int(edges[-1])


def reference_select(cands, budget, mode, top_p, top_k, skip_oversized):
    """Candidate-by-candidate port of the reference selector (§4.5), as a test oracle."""
    retained, chosen = 0, []
    for i in range(len(cands)):
        if cands.mandatory[i]:
            length = int(cands.end[i] - cands.begin[i])
            if length > budget - retained:
                return None
            chosen.append(i)
            retained += length
    optional = [i for i in range(len(cands)) if not cands.mandatory[i]]
    optional.sort(key=lambda i: (-max(0.0, cands.score[i]), cands.ordinal[i]))
    top = max([max(0.0, cands.score[i]) for i in optional], default=0.0)
    total = sum(max(0.0, cands.score[i]) / top for i in optional) if top > 0 else 0.0
    stop, mass, kept = "candidates_exhausted", 0.0, 0
    for i in optional:
        if mode == "top_p" and mass >= top_p:
            stop = "top_p_reached"
            break
        if mode == "top_k" and kept >= top_k:
            stop = "top_k_reached"
            break
        length = int(cands.end[i] - cands.begin[i])
        if length > budget - retained:
            stop = "budget_reached"
            if skip_oversized:
                continue
            break
        chosen.append(i)
        retained += length
        kept += 1
        mass += (max(0.0, cands.score[i]) / top) / total if top > 0 else 1.0 / len(optional)
    chosen.sort(key=lambda i: cands.begin[i])
    return tuple(int(cands.ordinal[i]) for i in chosen), retained, mass, stop


@settings(max_examples=300, deadline=None)
@given(
    candidate_sets(),
    st.integers(1, 600),
    MODES,
    st.floats(0.01, 1.0),
    st.integers(1, 8),
    st.booleans(),
)
def test_vectorised_selector_matches_the_reference_loop(cs, budget, mode, top_p, top_k, skip):
    cands, _ = cs
    got = select_candidates(
        cands, budget=budget, mode=mode, top_p=top_p, top_k=top_k, skip_oversized=skip
    )
    want = reference_select(cands, budget, mode, top_p, top_k, skip)
    if want is None:
        assert not got.ok
        assert got.stop_reason == "mandatory_query_exceeds_budget"
        return
    ordinals, retained, mass, stop = want
    assert got.ok
    assert got.ordinals == ordinals
    assert got.retained_tokens == retained
    assert got.stop_reason == stop
    assert abs(got.retained_mass - mass) < 1e-9


@settings(max_examples=200, deadline=None)
@given(candidate_sets(), st.integers(1, 600), MODES, st.booleans())
def test_selection_never_exceeds_budget_and_keeps_every_mandatory(cs, budget, mode, skip):
    cands, n_tokens = cs
    result = select_candidates(cands, budget=budget, mode=mode, top_k=3, skip_oversized=skip)
    mandatory_tokens = int(cands.lengths[cands.mandatory].sum())
    if mandatory_tokens > budget:
        assert not result.ok
        assert result.stop_reason == "mandatory_query_exceeds_budget"
        assert result.ordinals == ()
        assert result.retained_tokens == 0
        return
    assert result.ok
    assert result.retained_tokens <= budget
    by_ordinal = {int(o): i for i, o in enumerate(cands.ordinal)}
    kept = [by_ordinal[o] for o in result.ordinals]
    assert result.retained_tokens == int(cands.lengths[kept].sum())
    assert set(np.flatnonzero(cands.mandatory).tolist()) <= set(kept)
    assert 0.0 <= result.retained_mass <= 1.0 + 1e-12
    spans = kept_spans(cands, result.ordinals)
    assert all(a.end < b.begin for a, b in zip(spans, spans[1:], strict=False))
    assert all(0 <= s.begin < s.end <= n_tokens for s in spans)
    begins = [int(cands.begin[i]) for i in kept]
    assert begins == sorted(begins)


@settings(max_examples=200, deadline=None)
@given(
    candidate_sets(), st.integers(1, 600), st.floats(0.01, 1.0), st.floats(0.01, 1.0), st.booleans()
)
def test_top_p_retained_mass_is_monotone_in_top_p(cs, budget, p1, p2, skip):
    cands, _ = cs
    lo, hi = sorted((p1, p2))
    a = select_candidates(cands, budget=budget, mode="top_p", top_p=lo, skip_oversized=skip)
    b = select_candidates(cands, budget=budget, mode="top_p", top_p=hi, skip_oversized=skip)
    assert a.ok == b.ok
    if a.ok:
        assert a.retained_mass <= b.retained_mass + 1e-12
        assert set(a.ordinals) <= set(b.ordinals)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(2, 3000),
    st.sampled_from([32, 128, 512, 1024]),
    st.floats(0.01, 1.0),
    st.data(),
)
def test_budget_plan_always_fits_the_mandatory_fixed_chunks(n_tokens, chunk, r0, data):
    """The effective ratio charges K first, so fixed-grid selection under the planned budget
    never fails on mandatory chunks, and at most r0 of the droppable tokens (+1) are added."""
    q_end = data.draw(st.integers(1, n_tokens))
    q_begin = data.draw(st.integers(max(0, q_end - 8), q_end - 1))
    pins = data.draw(
        st.lists(st.tuples(st.integers(0, n_tokens - 1), st.integers(1, 50)), max_size=4)
    )
    pinned = tuple(Span(b, min(n_tokens, b + w)) for b, w in pins)
    suffix = data.draw(st.booleans())
    query = Span(q_begin, q_end)
    plan = plan_budget(
        n_tokens=n_tokens,
        prompt_tokens=n_tokens,
        r0=r0,
        chunk_size=chunk,
        query=query,
        required=pinned,
        suffix_candidates=suffix,
        mode="always",
    )
    assert plan.kept_tokens <= plan.budget <= n_tokens
    assert plan.budget <= plan.kept_tokens + r0 * (n_tokens - plan.kept_tokens) + 1 + 1e-3
    scores = np.asarray(data.draw(st.lists(st.floats(0, 1), min_size=n_tokens, max_size=n_tokens)))
    cands = build_candidates(
        fixed_grid(n_tokens, chunk),
        scores,
        query=query,
        pinned=plan.pinned,
        suffix_candidates=suffix,
        kind="sum",
    )
    assert int(cands.lengths[cands.mandatory].sum()) == plan.kept_tokens
    result = select_candidates(cands, budget=plan.budget)
    assert result.ok
    assert plan.kept_tokens <= result.retained_tokens <= plan.budget


# --------------------------------------------------------------------------- probe and anchors


def reference_probe(boundary, params, forced, interior):
    """Token-by-token port of the reference probe segmentation (§4.7 steps 4-5)."""
    s = len(boundary)
    forced = {c for c in forced if 0 < c < s}
    cuts = [0]
    for t in range(1, s):
        wanted = t in forced or (np.isfinite(boundary[t]) and boundary[t] > params.threshold)
        if not wanted:
            continue
        if t not in forced and t - cuts[-1] < params.min_segment:
            continue
        cuts.append(t)
    cuts.append(s)
    out = []
    for b, e in zip(cuts, cuts[1:], strict=False):
        while e - b > params.max_segment:
            lo = max(b + params.min_segment, b + params.max_segment // 2)
            hi = min(e - params.min_segment, b + params.max_segment)
            best, best_score = -1, 0.0
            for t in range(lo, hi + 1):
                if np.isfinite(interior[t]) and interior[t] > best_score:
                    best, best_score = t, interior[t]
            if best < 0:
                best = b + params.max_segment
            out.append((b, best))
            b = best
        out.append((b, e))
    return out


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 300),
    st.integers(1, 12),
    st.integers(0, 60),
    st.lists(st.integers(0, 310), max_size=6),
    st.data(),
)
def test_probe_segmentation_matches_the_reference_loop(n, min_seg, extra, forced, data):
    boundary = np.asarray(
        data.draw(
            st.lists(st.sampled_from([0.0, 0.2, 0.9, 0.95, 1.0, np.nan]), min_size=n, max_size=n)
        )
    )
    interior = np.asarray(data.draw(st.lists(st.floats(-1, 1), min_size=n, max_size=n)))
    params = ProbeParams(0.9, min_seg, min_seg + extra)
    cuts = probe_cuts(boundary, params, forced)
    begin, end = split_oversize(cuts, params, interior)
    got = list(zip(begin.tolist(), end.tolist(), strict=True))
    assert got == reference_probe(boundary, params, forced, interior)
    assert got[0][0] == 0 and got[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(got, got[1:], strict=False))


def reference_anchors(ids, n_chunks, chunk, query_tokens, radius, max_hits):
    """Position-by-position port of the reference 4-gram anchor scan (§4.1 step 3)."""
    s = len(ids)
    forced = np.zeros(n_chunks, dtype=bool)
    q0 = max(0, s - query_tokens)
    for q in range(q0, s - 3):
        hits = []
        for p in range(0, max(0, q0 - 4) + 1):
            if len(hits) > max_hits:
                break
            if p + 4 <= s and list(ids[p : p + 4]) == list(ids[q : q + 4]):
                hits.append(p)
        if 1 <= len(hits) <= max_hits:
            for p in hits:
                c = p // chunk
                forced[max(0, c - radius) : min(n_chunks - 1, c + radius) + 1] = True
    return forced


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(0, 3), min_size=4, max_size=160),
    st.sampled_from([4, 8, 32]),
    st.integers(0, 40),
    st.integers(0, 2),
    st.integers(0, 4),
)
def test_anchor_scan_matches_the_reference_loop(tokens, chunk, query_tokens, radius, max_hits):
    ids = np.asarray(tokens, dtype=np.int64)
    n_chunks = -(-ids.size // chunk)
    got = anchor_chunks(ids, n_chunks, chunk, query_tokens, radius, max_hits)
    want = reference_anchors(ids, n_chunks, chunk, query_tokens, radius, max_hits)
    assert got.tolist() == want.tolist()
