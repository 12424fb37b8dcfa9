"""Runner scoring and report aggregation on crafted results (no model)."""

from __future__ import annotations

import math

import pytest

from pflash_lab.bench.report import goal_lines, summarise, summary_markdown, sweep_table
from pflash_lab.bench.runner import (
    Reply,
    RunPlan,
    Served,
    TurnResult,
    answer_score,
    evidence_kept,
    read_jsonl,
    score_turn,
    write_jsonl,
)
from pflash_lab.corpus.cases import BenchCase, CaseSpec, Turn


def test_evidence_kept_ignores_whitespace_changes_and_counts_copies():
    served = "intro\n\nThe special  magic\nabc number is: 1234567.\n\nKey: x.\nKey: x.\n"
    assert evidence_kept(served, ["The special magic abc number is: 1234567."]) == 1
    assert evidence_kept(served, ["Key: x."] * 3) == 2  # only two copies survived
    assert evidence_kept(served, ["The special magic abc number is: 7654321."]) == 0


def test_a_needle_cut_in_half_is_not_retained():
    needle = "The special magic abc number is: 1234567."
    assert evidence_kept("The special magic abc\n\n[...] is: 1234567.", [needle]) == 0


def test_answer_score_is_the_share_of_gold_answers_in_the_reply():
    assert answer_score("It is 1234567.", ["1234567"]) == 1.0
    assert answer_score("ABCDE and fghij", ["abcde", "FGHIJ", "klmno", "pqrst"]) == 0.5
    assert answer_score("nothing", ["1234567"]) == 0.0


def _case() -> BenchCase:
    doc = "alpha text.\n\nThe special magic abc number is: 1234567.\n\nomega text."
    turn = Turn("What is the special magic abc number?", ("1234567",), (doc.split("\n\n")[1],))
    return BenchCase(CaseSpec("single_needle", 1, 2048, 0.5), doc, (turn,))


def test_score_turn_measures_retention_question_and_answer_on_the_served_prompt():
    case = _case()
    served = Served(
        "pflash",
        0.1,
        "omega text.\nQuestion: What is the special magic abc number?",
        (1,) * 30,
        30,
        12,
        500.0,
    )
    reply = Reply("I do not know", ttft_ms=250.0, prefill_ms=200.0)
    r = score_turn(case, 0, served, reply, engine="inprocess", prompt_tokens=300)
    assert (r.evidence_kept, r.evidence_total, r.retention) == (0, 1, 0.0)
    assert r.answers_in_prompt == 0 and r.question_kept
    assert r.answer_score == 0.0
    assert r.ttft_ms == 750.0  # in process: compression + time to the first token
    assert (r.served_tokens, r.kept_tokens, r.prompt_tokens) == (30, 12, 300)


def test_score_turn_over_http_reads_the_servers_prompt_and_ttft():
    case = _case()
    served = Served("pflash", 0.1, "", None, 0, 0, 0.0)
    reply = Reply(
        "It is 1234567.", 400.0, 100.0, served_text=case.user_content(0), served_tokens=42
    )
    r = score_turn(case, 0, served, reply, engine="http", prompt_tokens=300)
    assert r.retention == 1.0 and r.answers_in_prompt == 1 and r.answer_score == 1.0
    assert r.ttft_ms == 400.0 and r.served_tokens == 42


def _row(
    case_id, method, *, kept, score, ttft, compress=0.0, family="single_needle", keep=0.1, turn=0
):
    return TurnResult(
        case_id=case_id,
        family=family,
        length=2048,
        depth=None,
        placement="after",
        turn=turn,
        method=method,
        keep_ratio=1.0 if method == "full" else keep,
        engine="inprocess",
        prompt_tokens=2000,
        served_tokens=2000 if method == "full" else 200,
        kept_tokens=200,
        evidence_total=2,
        evidence_kept=kept,
        answers_total=1,
        answers_in_prompt=1 if kept else 0,
        question_kept=True,
        answer_score=score,
        compress_ms=compress,
        prefill_ms=ttft,
        ttft_ms=ttft,
        answer="",
    )


CRAFTED = [
    _row("a", "full", kept=2, score=1.0, ttft=1000),
    _row("a", "pflash", kept=2, score=1.0, ttft=250, compress=100),
    _row("a", "llmlingua", kept=0, score=0.0, ttft=3000, compress=2000),
    _row("b", "full", kept=2, score=1.0, ttft=2000),
    _row("b", "pflash", kept=1, score=0.0, ttft=1000, compress=300),
    _row("b", "llmlingua", kept=1, score=1.0, ttft=3000, compress=1000),
    _row("b", "pflash", kept=2, score=1.0, ttft=1200, compress=300, keep=0.3),  # sweep
]


def test_summary_computes_retention_accuracy_vs_full_and_ttft_ratio():
    by = {(s.family, s.method): s for s in summarise(CRAFTED)}
    p = by[("single_needle", "pflash")]
    assert p.turns == 2  # the sweep row at 0.3 is not in the main table
    assert p.retention == pytest.approx(0.75)  # (2/2 + 1/2) / 2
    assert p.accuracy == 0.5 and p.full_accuracy == 1.0
    assert p.accuracy_vs_full == -0.5
    assert p.ttft_ratio == pytest.approx((0.25 + 0.5) / 2)  # median of two
    assert p.compress_ms == 200.0
    ll = by[("single_needle", "llmlingua")]
    assert ll.retention == pytest.approx(0.25) and ll.in_prompt == 0.5
    assert by[("all", "full")].turns == 2


def test_goal_lines_report_the_miss_in_points():
    lines = "\n".join(goal_lines(summarise(CRAFTED)))
    assert "single_needle retention ≥ 98%: 75% (missed by 23 points)" in lines
    assert "+50 points; met" in lines
    assert "= 7.5×" in lines  # 1500 ms vs 200 ms medians


def test_sweep_table_lists_each_ratio():
    table = "\n".join(sweep_table(CRAFTED))
    assert "r=0.1" in table and "r=0.3" in table
    assert "| single_needle | pflash | 50% / 0% | 100% / 100% |" in table


def test_results_round_trip_through_jsonl(tmp_path):
    path = tmp_path / "results.jsonl"
    write_jsonl(path, CRAFTED[:3])
    write_jsonl(path, CRAFTED[3:])
    assert read_jsonl(path) == CRAFTED


def test_summary_markdown_and_plots_are_written(tmp_path):
    import matplotlib  # noqa: F401  (a test extra: the plots must render in CI)

    from pflash_lab.bench.plots import write_plots

    plots = write_plots(CRAFTED, tmp_path)
    assert plots == ["retention_vs_keep.png", "ttft_vs_length.png"]
    for name in plots:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = summary_markdown(CRAFTED, meta={"command": "pflash bench run"}, plots=plots)
    assert "### Evidence retention" in md and "![ttft_vs_length.png]" in md
    assert "| single_needle | 2 | 75% | 25% |" in md


def test_run_plan_sweeps_only_the_chosen_cases_and_methods():
    plan = RunPlan(keep=0.1, sweep=(0.05, 0.1, 0.2), sweep_cases=frozenset({_case().case_id}))
    case = _case()
    assert plan.ratios(case, "pflash") == [0.1, 0.05, 0.2]
    assert plan.ratios(case, "llmlingua") == [0.1]
    assert plan.ratios(case, "full") == [1.0]
    other = BenchCase(CaseSpec("single_needle", 2, 2048, 0.5), case.document, case.turns)
    assert plan.ratios(other, "pflash") == [0.1]
    assert math.isclose(plan.keep, 0.1)


def test_set_overrides_are_read_as_yaml_values_and_reach_the_config():
    from pflash_lab.bench.harness import inprocess_config, parse_overrides

    overrides = parse_overrides(
        ["select_segments=fixed", "select_chunk_size=128", "trace_path=null"]
    )
    assert overrides == {"select_segments": "fixed", "select_chunk_size": 128, "trace_path": None}
    config = inprocess_config(0.2, overrides)
    assert (config.keep_ratio, config.select_segments, config.select_chunk_size) == (
        0.2,
        "fixed",
        128,
    )
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_overrides(["select_segments"])
