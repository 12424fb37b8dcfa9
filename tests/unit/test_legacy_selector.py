"""The legacy (v1) selector: pooling, n_keep, head/tail forcing, 4-gram anchors, the Qwen3.5
repeat-token rule and the chunk-mean fill (ALGORITHM.md §3.1 step 6, §4.1, §10.3 item 32).
Chunks are 32 drafter tokens unless a test says otherwise."""

from __future__ import annotations

import numpy as np
import pytest

from pflash.compress.selection import (
    LegacyParams,
    anchor_chunks,
    anchor_tier,
    head_tail_counts,
    legacy_n_keep,
    legacy_smooth,
    repeat_token_chunks,
    select_legacy,
)
from pflash.config import build_config
from pflash.spans import Span

# --------------------------------------------------------------------------- pooling and n_keep


def test_legacy_smoothing_is_an_in_range_mean():
    x = np.arange(20, dtype=np.float32)
    got = legacy_smooth(x, 13)
    assert got.dtype == np.float32
    assert got[0] == pytest.approx(np.mean(x[0:7]))  # 7 in-range values, no zero padding
    assert got[10] == pytest.approx(np.mean(x[4:17]))
    assert got[19] == pytest.approx(np.mean(x[13:20]))


def test_legacy_smoothing_of_a_constant_is_constant_at_the_edges():
    assert legacy_smooth(np.full(5, 2.0), 13).tolist() == [2.0] * 5


@pytest.mark.parametrize(
    ("n_chunks", "keep", "n_keep"), [(100, 0.05, 5), (10, 0.05, 1), (313, 0.1, 31), (1, 0.0001, 1)]
)
def test_n_keep_is_floor_with_minimum_one(n_chunks, keep, n_keep):
    assert legacy_n_keep(n_chunks, keep) == n_keep


# --------------------------------------------------------------------------- head/tail forcing


def test_head_tail_kept_as_is_when_they_leave_room():
    """§4.1 worked example: n_keep 100 -> 8 head and 24 tail chunks."""
    assert head_tail_counts(100, 8, 24) == (8, 24)


def test_head_tail_scaled_down_when_they_crowd_out_the_fill():
    """§4.1 worked example: n_keep 20 -> B = 19, head floor(8*19/32) = 4, tail 15."""
    assert head_tail_counts(20, 8, 24) == (4, 15)


def test_head_tail_scaling_with_n_keep_one():
    assert head_tail_counts(1, 8, 24) == (0, 1)


def test_select_legacy_forces_scaled_head_and_tail():
    s = 32 * 400  # 400 chunks; keep 0.05 -> n_keep 20 -> head 4, tail 15, one fill slot
    ids = np.arange(s) % 50000  # no repeated 4-grams: no anchors
    smooth = np.zeros(s)
    smooth[32 * 200 : 32 * 201] = 1.0  # chunk 200 is the best-scoring body chunk
    sel = select_legacy(ids, smooth, 0.05)
    assert sel.n_keep == 20
    assert sel.chunks == (0, 1, 2, 3, 200, *range(385, 400))
    assert sel.forced == 19
    assert sel.kept == (Span(0, 128), Span(6400, 6432), Span(385 * 32, s))
    assert sel.retained_tokens == 20 * 32


# --------------------------------------------------------------------------- anchors


@pytest.mark.parametrize(
    ("n_chunks", "tier"), [(1023, (2, 8)), (1024, (4, 16)), (2047, (4, 16)), (2048, (8, 32))]
)
def test_anchor_parameter_tiers(n_chunks, tier):
    """§10.3 item 32."""
    assert anchor_tier(n_chunks) == tier


def _needle_ids(s: int, needle_at: int, key=(900001, 900002, 900003, 900004)) -> np.ndarray:
    ids = np.arange(s, dtype=np.int64) % 40000
    ids[needle_at : needle_at + 4] = key
    ids[s - 20 : s - 16] = key  # the question repeats the key
    return ids


def test_anchor_forces_the_needle_chunk_and_its_neighbours():
    s = 32 * 200
    ids = _needle_ids(s, needle_at=32 * 100 + 5)
    forced = anchor_chunks(ids, 200, 32, query_tokens=96, radius=2, max_hits=8)
    assert np.flatnonzero(forced).tolist() == [98, 99, 100, 101, 102]


def test_anchor_neighbourhood_is_clamped_at_the_start():
    s = 32 * 200
    ids = _needle_ids(s, needle_at=3)
    forced = anchor_chunks(ids, 200, 32, query_tokens=96, radius=2, max_hits=8)
    assert np.flatnonzero(forced).tolist() == [0, 1, 2]


def test_anchor_with_too_many_hits_is_a_common_phrase_and_forces_nothing():
    s = 32 * 200
    ids = np.arange(s, dtype=np.int64) % 40000
    key = (900001, 900002, 900003, 900004)
    for c in range(10, 19):  # 9 body hits > max_hits 8
        ids[32 * c : 32 * c + 4] = key
    ids[s - 20 : s - 16] = key
    assert not anchor_chunks(ids, 200, 32, query_tokens=96, radius=2, max_hits=8).any()
    assert anchor_chunks(ids, 200, 32, query_tokens=96, radius=0, max_hits=9).sum() == 9


def test_anchor_radius_zero_and_max_hits_zero_are_valid_overrides():
    s = 32 * 200
    ids = _needle_ids(s, needle_at=32 * 100)
    assert np.flatnonzero(anchor_chunks(ids, 200, 32, 96, radius=0, max_hits=8)).tolist() == [100]
    assert not anchor_chunks(ids, 200, 32, 96, radius=2, max_hits=0).any()


def test_anchor_body_excludes_the_query_pool():
    """Body starts run to q0 - 4 inclusive: a match that ends inside the pool is not a hit."""
    s = 32 * 200
    q0 = s - 96
    ids = np.arange(s, dtype=np.int64) % 40000
    key = (900001, 900002, 900003, 900004)
    ids[q0 - 3 : q0 + 1] = key  # starts at q0 - 3: outside the body scan
    ids[s - 10 : s - 6] = key
    assert not anchor_chunks(ids, 200, 32, 96, radius=0, max_hits=8).any()
    ids[q0 - 4 : q0] = key  # starts at q0 - 4: the last body start
    assert np.flatnonzero(anchor_chunks(ids, 200, 32, 96, radius=0, max_hits=8)).tolist() == [
        (q0 - 4) // 32
    ]


def test_anchor_config_overrides_reach_the_selector():
    params = LegacyParams.from_config(
        build_config({}, env={"PFLASH_ANCHOR_RADIUS": "0", "PFLASH_ANCHOR_MAX_HITS": "3"})
    )
    assert (params.anchor_radius, params.anchor_max_hits) == (0, 3)
    tiered = LegacyParams.from_config(build_config({}, env={}))
    assert (tiered.anchor_radius, tiered.anchor_max_hits) == (None, None)


def test_select_legacy_keeps_anchor_chunks_beyond_n_keep():
    """Forced chunks may exceed n_keep: nothing is then added or dropped (§12 item 12)."""
    s = 32 * 200  # n_keep = 10 at 0.05 -> head 2, tail 7 (9 forced), plus 5 anchor chunks
    ids = _needle_ids(s, needle_at=32 * 100)
    smooth = np.zeros(s)
    smooth[32 * 50 : 32 * 51] = 9.0  # would be the fill's pick, but there is no slot left
    sel = select_legacy(ids, smooth, 0.05)
    assert sel.n_keep == 10
    assert sel.chunks == (0, 1, 98, 99, 100, 101, 102, *range(193, 200))
    assert sel.forced == 14
    assert 50 not in sel.chunks


# --------------------------------------------------------------------------- fill


def test_fill_by_chunk_mean_ties_to_the_lower_index():
    s = 32 * 100  # n_keep 10 at 0.1 -> head 2, tail 7, one fill slot
    ids = np.arange(s) % 40000
    smooth = np.zeros(s)
    smooth[32 * 40 : 32 * 41] = 1.0
    smooth[32 * 30 : 32 * 31] = 1.0  # equal mean, lower index wins
    sel = select_legacy(ids, smooth, 0.1)
    assert sel.chunks == (0, 1, 30, *range(93, 100))


def test_fill_uses_the_mean_over_a_short_last_chunk():
    params = LegacyParams(chunk_size=4, head_chunks=0, tail_chunks=0, anchor_max_hits=0)
    ids = np.arange(10)
    smooth = np.array([1, 1, 1, 1, 0, 0, 0, 0, 1.5, 1.5])
    sel = select_legacy(ids, smooth, 0.34, params)  # 3 chunks -> n_keep 1
    assert sel.chunks == (2,)  # mean 1.5 over its 2 tokens beats chunk 0's 1.0
    assert sel.kept == (Span(8, 10),)


# --------------------------------------------------------------------------- repeat-token rule


def test_repeat_rule_marks_chunks_of_frequent_tokens_by_frequency_then_id():
    c = 4
    body = np.arange(200, dtype=np.int64) + 1000
    body[[5, 50, 90, 130, 170]] = 7  # 5 occurrences
    body[[20, 60, 100, 140]] = 3  # 4 occurrences
    body[[30, 31]] = 9  # 2: below repeat_min
    ids = np.concatenate((body, np.arange(96) + 5000))
    selected = np.zeros(-(-ids.size // c), dtype=bool)
    out = repeat_token_chunks(ids, selected, c, 96, repeat_min=4, repeat_max=32, limit=7)
    # token 7 first (chunks 1, 12, 22, 32, 42), then token 3 until 7 chunks: 5, 15
    assert np.flatnonzero(out).tolist() == [1, 5, 12, 15, 22, 32, 42]
    assert not selected.any()  # input not mutated


def test_repeat_rule_does_nothing_once_the_limit_is_reached():
    ids = np.zeros(300, dtype=np.int64)
    selected = np.zeros(10, dtype=bool)
    selected[:3] = True
    out = repeat_token_chunks(ids, selected, 32, 96, repeat_min=4, repeat_max=32, limit=3)
    assert np.array_equal(out, selected)


def test_repeat_rule_is_only_on_for_qwen35_legacy():
    s = 32 * 100
    ids = np.arange(s, dtype=np.int64) % 40000
    ids[[100, 1100, 2100, 3000]] = 777777  # a rare token repeated 4 times in the body
    smooth = np.zeros(s)
    plain = select_legacy(ids, smooth, 0.5)
    qwen35 = select_legacy(ids, smooth, 0.5, LegacyParams(repeat_rule=True))
    # n_keep 50: head 8 + tail 24 forced; the rule adds the chunks of token 777777 outside
    # them (34, 65), then the all-zero fill takes the lowest free indices
    assert plain.chunks == (*range(0, 26), *range(76, 100))
    assert qwen35.chunks == (*range(0, 24), 34, 65, *range(76, 100))
    assert qwen35.forced == 34


def test_short_prompt_query_grams_match_themselves_at_token_zero():
    """Reference parity: when the whole prompt is the query pool (q0 = 0) the body scan still
    visits p = 0, so the first query 4-gram matches itself and forces chunk 0 +- radius."""
    ids = np.arange(10)
    forced = anchor_chunks(ids, 3, 4, query_tokens=96, radius=1, max_hits=8)
    assert forced.tolist() == [True, True, False]
