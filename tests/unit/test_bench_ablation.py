"""`pflash bench ablate`: variants parse, group by drafter pass, and score retention for real."""

from __future__ import annotations

import pytest

from pflash.bench.ablation import (
    AblationEngine,
    parse_variant,
    retention_table,
    run_case,
    variant,
)
from pflash.bench.suite import serve_args
from pflash.corpus.cases import CaseSpec, generate, token_counter


def test_variant_values_are_read_as_yaml():
    v = parse_variant("la:drafter_lookahead_tokens=8,select_lexical=cascade,scoring_head_gguf=null")
    assert v.name == "la"
    assert v.settings == {
        "drafter_lookahead_tokens": 8,
        "select_lexical": "cascade",
        "scoring_head_gguf": None,
    }
    assert parse_variant("base:").settings == {}
    with pytest.raises(ValueError):
        parse_variant("no-colon")
    with pytest.raises(ValueError):
        parse_variant("x:select_lexical")


def test_selection_only_variants_share_a_drafter_pass_and_drafter_changes_do_not():
    base = {"select_lexical": "off"}
    a, b = variant("a", select_lexical="cascade"), variant("b", select_position_prior="distance")
    c = variant("c", drafter_lookahead_tokens=8)
    assert a.drafter_key(base) == b.drafter_key(base)
    assert c.drafter_key(base) != a.drafter_key(base)
    for key, value in (("drafter_attention", "window"), ("drafter_window_tokens", 512)):
        assert variant("w", **{key: value}).drafter_key(base) != a.drafter_key(base), key


@pytest.mark.model
def test_real_drafter_case_is_scored_per_variant_and_tabulated(smollm2_tokenizer):
    base = {**serve_args(), "keep_ratio": 0.1, "curve": ()}
    variants = [variant("fixed", select_segments="fixed"), variant("full-keep", keep_ratio=1.0)]
    engine = AblationEngine(base, variants, threads=1)
    case = generate(CaseSpec("single_needle", 7, 1024, 0.5), token_counter(smollm2_tokenizer))
    rows = run_case(case, engine)
    by = {r.method: r for r in rows}
    assert set(by) == {"fixed", "full-keep"}
    # keep 1.0 serves everything, so the needle is there; at 0.1 the prompt is much shorter
    assert by["full-keep"].evidence_kept == by["full-keep"].evidence_total == 1
    assert by["fixed"].served_tokens < 0.5 * by["fixed"].prompt_tokens
    assert by["fixed"].compress_ms > 0
    table = retention_table(rows, ["fixed", "full-keep"])
    assert "| single_needle | 1 |" in table and "**100%**" in table


def test_a_crashed_baseline_turn_is_reported_and_not_scored():
    from pflash.bench.runner import TurnResult

    def row(method, kept, error=""):
        return TurnResult(
            "c", "single_needle", 2048, 0.5, "after", 0, method, 0.1, "ablation",
            2000, 200, 180, 1, kept, 1, kept, True, 0.0, 10.0, None, 10.0, "", error,
        )  # fmt: skip

    table = retention_table(
        [row("cascade", 1), row("llmlingua", 0, error="AssertionError")], ["cascade", "llmlingua"]
    )
    assert "| single_needle | 1 | 100% |\n" in table  # nothing left to score for llmlingua
    assert "Failed turns (not scored): llmlingua 1" in table
