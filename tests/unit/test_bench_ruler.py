"""`python -m pflash_lab.bench.ruler`: RULER's own generators at tiny lengths, the evidence
each case carries, and what a reader of a served prompt could answer (RULER's metric)."""

from __future__ import annotations

import pytest

from pflash_lab.bench.ruler import (
    RulerCase,
    RulerRow,
    generate_isolated,
    ranking_recall,
    reader_answer,
    results_table,
    ruler_score,
    tokenizer_dir,
)

SEED = 91357  # this test's own; the benchmark's seeds are chosen per run


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer):
    return tokenizer_dir()


def generate(task: str, length: int, tokenizer) -> RulerCase:
    """One case; a generator that loops (RULER's retry loops can) fails the test."""
    (case,) = generate_isolated(task, length, SEED, 1, tokenizer, timeout_s=120)
    return case


# QA needs 10 documents at least, ~2K tokens: RULER's own search starts there
@pytest.mark.parametrize(
    ("task", "length"), [("niah_multikey_2", 1024), ("vt", 1024), ("qa_1", 4096), ("qa_2", 4096)]
)
def test_a_case_carries_its_golds_and_the_evidence_in_its_context(tokenizer, task, length):
    case = generate(task, length, tokenizer)
    assert case.outputs and case.evidence
    assert all(e in case.context for e in case.evidence)
    assert case.content.rfind(case.context) > 0 and case.question
    # the whole prompt answers; the prompt without its context does not
    assert ruler_score(case, reader_answer(case, case.content)) == 100.0
    bare = case.messages(context="")[0]["content"]
    assert ruler_score(case, reader_answer(case, bare)) == 0.0
    assert RulerCase.from_json(case.to_json()) == case


def test_a_variable_chain_is_answered_only_as_far_as_its_served_links_reach(tokenizer):
    case = generate("vt", 1024, tokenizer)
    first, second, *rest = case.evidence
    answer = reader_answer(case, f"{first}. {' '.join(rest)}. {case.question}")
    assert answer.split() == [case.outputs[0]]  # the chain breaks at the missing link


def test_common_words_are_ranked_from_the_real_list_not_the_worked_example(tokenizer):
    case = generate("cwe", 2048, tokenizer)
    example = case.content[: case.content.rfind(case.context)]
    assert "Answer:" in example  # RULER's cwe opens with the task worked
    assert ranking_recall(case, case.content) == 100.0
    assert ranking_recall(case, example + case.question) == 0.0


def test_frequent_coded_words_are_ranked_from_the_served_text(tokenizer):
    case = generate("fwe", 1024, tokenizer)
    assert ranking_recall(case, case.content) == 100.0
    words = case.context.split()
    assert ranking_recall(case, " ".join(words[: len(words) // 50])) < 100.0


def test_the_table_puts_the_methods_side_by_side_per_task_and_length():
    def row(task, method, kept, ruler, ms):
        return RulerRow("c", task, 4096, 1, method, 1000, 120, 2, kept, ruler, True, ms)

    rows = [
        row("qa_2", "default", 2, 100.0, 3000.0),
        row("qa_2", "uniform", 1, 0.0, 10.0),
        row("cwe", "default", 0, 90.0, 2000.0),
        row("cwe", "uniform", 0, 80.0, 10.0),
    ]
    table = results_table(rows, ["default", "llmlingua", "uniform"], "evidence")
    assert "| qa_2 | 100 · 50 |" in table and "| cwe | 90 · 80 |" in table
    assert "| compression s, median | 2.5 · 0.0 |" in table


def test_the_timing_table_gives_medians_and_the_median_of_per_case_ratios():
    from pflash_lab.bench.ruler_timing import ratio_table

    def row(length, base, head, error=""):
        return {
            "length": length,
            "base_ms": base,
            "head_ms": head,
            "ratio": head / base,
            "base_error": "",
            "head_error": error,
        }

    rows = [row(4096, 1000, 1100), row(4096, 2000, 2000), row(4096, 4000, 6000)]
    rows += [row(8192, 5000, 5500), row(8192, 5000, 1, error="selection")]
    table = ratio_table(rows)
    assert "| 4K | 3 | 2.0 | 2.0 | 1.10x (1.00-1.50) |" in table
    assert "| 8K | 1 | 5.0 | 5.5 | 1.10x (1.10-1.10) |" in table  # a failed case is no pair


def test_merged_runs_count_each_case_and_method_once(tmp_path):
    import dataclasses
    import json

    from pflash_lab.bench.ruler import merged_rows

    def row(case, method):
        return RulerRow(case, "vt", 4096, 1, method, 1000, 120, 5, 5, 100.0, True, 10.0)

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(
        "".join(
            json.dumps(dataclasses.asdict(r)) + "\n"
            for r in [row("vt-1", "default"), row("vt-1", "default"), row("vt-2", "default")]
        )
    )
    b.write_text(json.dumps(dataclasses.asdict(row("vt-1", "llmlingua"))) + "\n")
    got = sorted((r.case_id, r.method) for r in merged_rows([a, b]))
    assert got == [("vt-1", "default"), ("vt-1", "llmlingua"), ("vt-2", "default")]
