"""`pflash bench ablate`: variants parse, group by drafter pass, and score retention for real;
the control serves unrelated questions and is reported beside the real retention."""

from __future__ import annotations

import re

import pytest

from pflash_lab.bench.ablation import (
    CONTROL_QUESTIONS,
    AblationEngine,
    contribution_table,
    control_case,
    parse_variant,
    retention_table,
    run_case,
    run_control,
    variant,
    with_controls,
)
from pflash_lab.bench.harness import serve_args
from pflash_lab.corpus.cases import CaseSpec, token_counter
from pflash_lab.corpus.families import generate


def test_variant_values_are_read_as_yaml():
    v = parse_variant("la:drafter_head_layer=17,select_lexical=cascade,scoring_head_gguf=null")
    assert v.name == "la"
    assert v.settings == {
        "drafter_head_layer": 17,
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
    c = variant("c", drafter_head_layer=17)
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
    from pflash_lab.bench.runner import TurnResult

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


@pytest.mark.model
def test_variants_sharing_a_pass_each_get_the_evidence_they_ask_for(smollm2_tokenizer):
    """The embedder alone, then the embedder with the tap projection, on one drafter pass:
    the second asks the pass for projection scores the first did not (a reused pass without
    them failed every mix turn, recorded as 0% and no error)."""
    base = {**serve_args(), "keep_ratio": 0.1, "curve": ()}
    semantic = variant("semantic", select_semantic_weight=1.0, select_projection_weight=0.0)
    mix = variant("mix", select_semantic_weight=0.5, select_projection_weight=0.5)
    assert semantic.drafter_key(base) == mix.drafter_key(base)
    engine = AblationEngine(base, [semantic, mix], threads=1)
    case = generate(CaseSpec("paraphrased_needle", 5, 1024, 0.5), token_counter(smollm2_tokenizer))
    rows = {r.method: r for r in run_case(case, engine)}
    for name in ("semantic", "mix"):
        assert rows[name].error == "" and rows[name].served_tokens > 0, rows[name]
        assert rows[name].served_tokens < 0.5 * rows[name].prompt_tokens


def test_a_variant_that_fails_to_compress_is_an_error_row_not_a_zero():
    from pflash_lab.bench.runner import Served

    class FailingEngine:
        configs = {"broken": None}

        def encode(self, messages):
            return (1, 2, 3)

        def serve(self, messages):
            return {"broken": Served("broken", 0.1, "", (), 0, 0, 0.0, error="drafter: no tap")}

    case = generate(CaseSpec("single_needle", 7, 512, 0.5), lambda text: len(text.split()))
    (row,) = run_case(case, FailingEngine())
    assert row.error == "drafter: no tap"
    assert "Failed turns (not scored): broken 1" in retention_table([row], ["broken"])


# --------------------------------------------------------------------------- control


class LexicalEngine:
    """A stand-in for `AblationEngine` with no model: it serves the paragraphs of the last
    user message that share a content word with that message's question, so a question
    that names its evidence keeps it and a control question keeps none of it."""

    configs = {"lexical": None}

    def encode(self, messages: list[dict]) -> tuple[int, ...]:
        return tuple(range(len(" ".join(m["content"] for m in messages).split())))

    def serve(self, messages: list[dict]) -> dict:
        from pflash_lab.bench.runner import Served
        from pflash_lab.corpus.wording import shared_words

        body, _, question = messages[-1]["content"].rpartition("Question: ")
        kept = [p for p in body.split("\n\n") if shared_words(question, p)]
        text = "\n\n".join([*kept, question])
        return {"lexical": Served("lexical", 0.1, text, None, len(text.split()), 0, 1.0)}


@pytest.fixture(scope="module")
def count(smollm2_tokenizer):
    return token_counter(smollm2_tokenizer)


def test_control_case_swaps_every_question_and_keeps_document_and_evidence(count):
    case = generate(CaseSpec("multi_turn_paraphrase", 3, 2048), count)
    control = control_case(case)
    assert control.document == case.document and control.spec == case.spec
    assert [t.evidence for t in control.turns] == [t.evidence for t in case.turns]
    assert [t.answers for t in control.turns] == [t.answers for t in case.turns]
    questions = [t.question for t in control.turns]
    assert all(q in CONTROL_QUESTIONS for q in questions) and len(set(questions)) == 3


def test_control_questions_share_no_word_with_any_fact_needle_or_question_wording():
    from pflash_lab.corpus.cases import needle
    from pflash_lab.corpus.paraphrase import SUBJECTS
    from pflash_lab.corpus.wording import shared_words

    wordings = [needle("key", "1"), "One of the special magic numbers for key is"]
    for subject in SUBJECTS:
        wordings += subject.nouns
        for concept in subject.concepts:
            wordings += [*concept.statements, *concept.questions]
    for question in CONTROL_QUESTIONS:
        for wording in wordings:
            assert not shared_words(question, wording), (question, wording)


def test_control_rows_sit_next_to_the_real_ones_and_their_difference_is_reported(count):
    case = generate(CaseSpec("single_needle", 7, 1024, 0.5), count)
    engine = LexicalEngine()
    rows = run_case(case, engine) + run_control(case, engine)
    by = {r.method: r for r in rows}
    assert set(by) == {"lexical", "lexical (control)"}
    assert by["lexical"].evidence_kept == 1 and by["lexical (control)"].evidence_kept == 0
    assert by["lexical (control)"].case_id == case.case_id
    table = retention_table(rows, with_controls(["lexical"]))
    assert "| family | turns | lexical | lexical (control) |" in table
    assert "| single_needle | 1 | 100% | 0% |" in table
    assert "| single_needle | +100 |" in contribution_table(rows, ["lexical"])


def test_ablate_accepts_the_control_flag():
    import argparse

    from pflash_lab.bench.ablation import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser.add_subparsers(dest="command"))
    assert parser.parse_args(["ablate", "--out", "x", "--control"]).control is True
    assert parser.parse_args(["ablate", "--out", "x"]).control is False


def test_the_uniform_baseline_spreads_its_budget_evenly_over_the_document(smollm2_tokenizer):
    from pflash_lab.bench.baselines import uniform_chunks

    document = " ".join(f"w{i:04d}" for i in range(2000))  # one marker every few tokens
    total = len(smollm2_tokenizer(document, add_special_tokens=False)["input_ids"])
    out = uniform_chunks(document, total // 10, smollm2_tokenizer, chunk=32)
    assert out.kept_tokens == total // 10
    pieces = out.document.split("\n\n")
    found = [re.search(r"w(\d{4})\b", p) for p in pieces]
    firsts = [int(m.group(1)) for m in found if m]  # a cut-short last piece may hold none
    assert len(firsts) >= len(pieces) - 1
    assert firsts == sorted(firsts)  # source order
    assert firsts[0] < 100 and firsts[-1] > 1700  # from the start to near the end
    gaps = [b - a for a, b in zip(firsts, firsts[1:], strict=False)]
    assert max(gaps) < 2 * min(gaps) + 20  # evenly spaced, not clustered


def test_the_uniform_column_is_served_at_the_first_variants_realized_keep(smollm2_tokenizer):
    base = {**serve_args(), "keep_ratio": 0.1, "curve": ()}
    engine = AblationEngine(base, [variant("fixed", select_segments="fixed")], threads=1)
    case = generate(CaseSpec("single_needle", 7, 1024, 0.5), token_counter(smollm2_tokenizer))
    rows = {r.method: r for r in run_case(case, engine, uniform=True)}
    assert set(rows) == {"fixed", "uniform"}
    realized = rows["fixed"].served_tokens / rows["fixed"].prompt_tokens
    assert rows["uniform"].keep_ratio == pytest.approx(realized)
    assert 0 < rows["uniform"].kept_tokens < 0.3 * rows["fixed"].prompt_tokens
