"""Drafter scoring sessions (§6.4): a resumed prompt scores exactly like one from scratch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pflash.compress.plan.query import QueryWindow
from pflash.compress.scoring import ScoreRequest
from pflash.config import build_config
from pflash.models.drafter.scorer import DrafterScorer
from pflash.models.drafter.sessions import (
    DrafterSession,
    RecurrentCheckpoint,
    SessionTable,
    common_prefix,
    extend_rows,
    plan_resume,
)
from pflash.models.gguf_io import tiny_decoder
from pflash.models.loading import LoadedModel
from pflash.models.source import ModelSource
from pflash.spans import Span

torch.set_num_threads(1)

KINDS = {"llama": ("llama", 2, 4), "qwen3_5": ("qwen35", 3, 4)}  # arch, head layer, layers


def make_scorer(kind: str, sessions: int = 2) -> DrafterScorer:
    arch, head, layers = KINDS[kind]
    model = tiny_decoder(kind, layers=layers, seed=11)
    loaded = LoadedModel(model, ModelSource("tiny", Path(".")), None, 0.0, False, architecture=arch)
    config = build_config(
        {"drafter_head_layer": head, "drafter_chunk_tokens": 32, "drafter_sessions": sessions},
        env={},
    )
    return DrafterScorer(config, loaded)


@pytest.fixture(scope="module", params=list(KINDS))
def scorer(request):
    return make_scorer(request.param)


def tokens(n: int, seed: int) -> tuple[int, ...]:
    return tuple(
        torch.randint(0, 300, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
    )


def turn_one() -> ScoreRequest:
    ids = tokens(200, 1)
    windows = (QueryWindow(Span(199, 200), 1.0, "main"), QueryWindow(Span(180, 188), 1.0, "turn"))
    return ScoreRequest(ids=ids, windows=windows, query=Span(199, 200))


def turn_two(key: str | None = "conv", *, want_tap: bool = False) -> ScoreRequest:
    """Turn one without its 3-token generation prompt, then 60 new tokens; turn one's main
    window is now a history window (weight 1/2)."""
    ids = turn_one().ids[:197] + tokens(60, 2)
    windows = (
        QueryWindow(Span(256, 257), 1.0, "main"),
        QueryWindow(Span(240, 248), 1.0, "turn"),
        QueryWindow(Span(199, 200), 0.5, "history"),
    )
    return ScoreRequest(
        ids=ids, windows=windows, query=Span(256, 257), session_key=key, want_tap=want_tap
    )


def with_key(req: ScoreRequest, key: str | None) -> ScoreRequest:
    return ScoreRequest(**{**req.__dict__, "session_key": key})


def test_resumed_second_turn_scores_equal_scratch_scores(scorer):
    scorer.sessions.drop("conv")
    first = scorer(with_key(turn_one(), "conv"))
    assert (first.scorer_resume, first.scorer_new_tokens) == (0, 200)
    resumed = scorer(turn_two("conv"))
    scratch = scorer(turn_two(None))
    np.testing.assert_allclose(resumed.mass, scratch.mass, atol=1e-6)
    # attention-only caches cut back to the shared prefix (197); Qwen3.5's recurrent state
    # resumes from the checkpoint taken 64 tokens before turn one's end
    want_resume = 197 if scorer.profile.name != "qwen35" else 200 - 64
    assert resumed.scorer_resume == want_resume
    assert resumed.scorer_new_tokens == 257 - want_resume
    assert resumed.extras["skipped_windows"] == []


def test_identical_retry_runs_no_tokens_and_scores_the_same(scorer):
    scorer.sessions.drop("retry")
    first = scorer(turn_two("retry"))
    again = scorer(turn_two("retry"))
    assert again.scorer_new_tokens == 0 and again.scorer_resume == 257
    np.testing.assert_allclose(again.mass, first.mass, atol=1e-7)


def test_resumed_tap_equals_scratch_tap(scorer):
    scorer.sessions.drop("tap")
    scorer(ScoreRequest(**{**turn_one().__dict__, "session_key": "tap", "want_tap": True}))
    resumed = scorer(turn_two("tap", want_tap=True))
    scratch = scorer(turn_two(None, want_tap=True))
    assert resumed.scorer_resume > 0
    np.testing.assert_allclose(resumed.tap, scratch.tap, atol=1e-5)


def test_a_tap_request_after_a_session_without_tap_recomputes_the_tap(scorer):
    scorer.sessions.drop("notap")
    scorer(with_key(turn_one(), "notap"))
    resumed = scorer(turn_two("notap", want_tap=True))
    assert resumed.scorer_resume == 0 and resumed.tap.shape == (257, 64)


def test_history_window_without_stored_rows_is_skipped_keeping_its_weight_slot():
    scorer = make_scorer("llama")
    first = turn_one()
    scorer(with_key(first, "h"))
    gone = QueryWindow(Span(100, 104), 0.25, "history")  # never a window before: no rows
    req = turn_two("h")
    windows = req.windows + (gone,)
    resumed = scorer(ScoreRequest(**{**req.__dict__, "windows": windows}))
    assert resumed.extras["skipped_windows"] == [[100, 104]]
    expected = scorer(
        ScoreRequest(**{**req.__dict__, "session_key": None})
    )  # same windows minus the gone one
    np.testing.assert_allclose(resumed.mass, expected.mass, atol=1e-6)


def test_sessions_are_evicted_least_recently_used_first():
    scorer = make_scorer("llama", sessions=2)
    for key in ("a", "b"):
        scorer(with_key(turn_one(), key))
    scorer(with_key(turn_one(), "a"))  # a is now the most recent
    scorer(with_key(turn_one(), "c"))
    assert scorer.sessions.keys() == ["a", "c"]
    assert scorer(turn_two("c")).scorer_resume == 197
    assert scorer(turn_two("b")).scorer_resume == 0  # b was evicted


def test_zero_sessions_always_score_from_scratch():
    scorer = make_scorer("llama", sessions=0)
    scorer(with_key(turn_one(), "z"))
    assert len(scorer.sessions) == 0
    assert scorer(turn_two("z")).scorer_resume == 0


def test_a_failed_request_forgets_its_session():
    scorer = make_scorer("llama")
    scorer(with_key(turn_one(), "f"))
    bad = ScoreRequest(
        ids=turn_one().ids,
        windows=(QueryWindow(Span(0, 1), 1.0, "main"),),
        query=Span(0, 1),
        session_key="f",
    )
    with pytest.raises(Exception, match="no visible keys"):
        scorer(bad)
    assert "f" not in scorer.sessions


# --------------------------------------------------------------------------- pure decisions


def session(ids, *, rows=(), checkpoint=None, tap_len=None):
    s = DrafterSession(
        ids=tuple(ids), cache=None, keys=None, keys_from_head=False, checkpoint=checkpoint
    )
    if tap_len is not None:
        s.tap = torch.zeros(tap_len, 1)
    for span in rows:
        s.remember_rows(span, object())
    return s


MAIN = (QueryWindow(Span(18, 20), 1.0, "main"),)


def test_common_prefix_counts_equal_leading_ids():
    assert common_prefix((1, 2, 3), (1, 2, 4, 5)) == 2
    assert common_prefix((), (1,)) == 0 and common_prefix((1, 2), (1, 2)) == 2


def test_croppable_cache_resumes_at_the_shared_prefix():
    plan = plan_resume(
        session(range(15)),
        tuple(range(12)) + (99,) * 8,
        MAIN,
        croppable=True,
        want_tap=False,
        keys_from_head=False,
    )
    assert plan.resume == 12 and not plan.restore_checkpoint


def test_recurrent_cache_resumes_at_full_prefix_or_checkpoint_only():
    ids = tuple(range(20))
    full = plan_resume(
        session(range(15)), ids, MAIN, croppable=False, want_tap=False, keys_from_head=False
    )
    assert full.resume == 15
    diverged = ids[:12] + (99,) * 8
    none = plan_resume(
        session(range(15)), diverged, MAIN, croppable=False, want_tap=False, keys_from_head=False
    )
    assert none.resume == 0
    cp = plan_resume(
        session(range(15), checkpoint=RecurrentCheckpoint(10, {})),
        diverged,
        MAIN,
        croppable=False,
        want_tap=False,
        keys_from_head=False,
    )
    assert (cp.resume, cp.restore_checkpoint) == (10, True)


def test_main_window_before_the_resume_point_needs_its_exact_stored_rows():
    ids = tuple(range(20))
    old = session(ids)
    assert (
        plan_resume(old, ids, MAIN, croppable=True, want_tap=False, keys_from_head=False).resume
        == 18
    )
    stored = session(ids, rows=[Span(18, 20)])
    plan = plan_resume(stored, ids, MAIN, croppable=True, want_tap=False, keys_from_head=False)
    assert plan.resume == 20 and plan.stored == (Span(18, 20),)


def test_stored_rows_keep_only_the_eight_most_recent_windows():
    s = session(range(40), rows=[Span(i, i + 1) for i in range(10)])
    assert list(s.rows) == [Span(i, i + 1) for i in range(2, 10)]


def test_session_table_get_refreshes_recency():
    table = SessionTable(2)
    table.put("a", session(()))
    table.put("b", session(()))
    table.get("a")
    table.put("c", session(()))
    assert table.keys() == ["a", "c"]


def test_a_resumed_tap_names_the_tap_whose_rows_it_reuses(scorer):
    """What the segment probe's memo relies on: `tap_parent` names the earlier tap, and the
    rows up to `scorer_resume` are that tap's rows, unchanged."""
    scorer.sessions.drop("chain")
    first = scorer(
        ScoreRequest(**{**turn_one().__dict__, "session_key": "chain", "want_tap": True})
    )
    resumed = scorer(turn_two("chain", want_tap=True))
    assert first.tap_id and first.tap_parent is None
    assert resumed.tap_parent == first.tap_id and resumed.tap_id != first.tap_id
    r = resumed.scorer_resume
    assert r > 0
    np.testing.assert_array_equal(resumed.tap[:r], first.tap[:r])
    scratch = scorer(turn_two(None, want_tap=True))
    assert scratch.tap_id is None and scratch.tap_parent is None  # no session, no name


def test_rows_appended_to_a_session_leave_what_earlier_results_hold_unchanged():
    first = torch.arange(12.0).view(6, 2)
    buffer, rows = extend_rows(None, 0, 0, [first[:4], first[4:]])
    assert torch.equal(rows, first)
    held = rows.clone()
    buffer, grown = extend_rows(buffer, 6, 6, [torch.full((3, 2), 7.0)])  # full resume: room made
    assert buffer.shape[0] > 9 and torch.equal(grown[:6], held) and torch.equal(rows, held)
    buffer2, more = extend_rows(buffer, 9, 9, [torch.full((1, 2), 8.0)])  # written in place
    assert buffer2 is buffer and more.data_ptr() == grown.data_ptr()
    assert torch.equal(grown, torch.cat([held, torch.full((3, 2), 7.0)]))  # its rows untouched
    assert torch.equal(more[9], torch.tensor([8.0, 8.0]))
    # a resume before the end (a rewound turn) never writes over rows a result may hold
    buffer3, cut = extend_rows(buffer2, 10, 5, [torch.zeros(2, 2)])
    assert buffer3 is not buffer2 and torch.equal(more[:10], torch.cat([grown, more[9:10]]))
    assert torch.equal(cut, torch.cat([held[:5], torch.zeros(2, 2)]))


def test_a_conversation_resumed_turn_after_turn_scores_as_from_scratch(scorer):
    """Keys and tap grow in place across turns; every turn equals the same prompt scored
    without a session, and the first turn's result is unchanged by the later ones."""
    scorer.sessions.drop("grow")
    ids = tokens(200, 7)

    def turn(end: int, key: str | None) -> ScoreRequest:
        query = Span(end - 4, end)
        windows = (QueryWindow(query, 1.0, "main"),)
        return ScoreRequest(
            ids=ids[:end], windows=windows, query=query, session_key=key, want_tap=True
        )

    first = scorer(turn(180, "grow"))
    kept_mass, kept_tap = first.mass.copy(), first.tap.copy()
    for end in (188, 194, 200):
        resumed, scratch = scorer(turn(end, "grow")), scorer(turn(end, None))
        assert resumed.scorer_resume > 0
        np.testing.assert_allclose(resumed.mass, scratch.mass, atol=1e-6)
        np.testing.assert_allclose(resumed.tap, scratch.tap, atol=1e-5)
    np.testing.assert_array_equal(first.mass, kept_mass)
    np.testing.assert_array_equal(first.tap, kept_tap)
