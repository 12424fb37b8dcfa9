"""The head trainer's paraphrase-style pairs (`paraphrase_pairs`) are held apart from the
bench: no sentence and no concept of the bench's word resource, not a bench family, every
fact in their documents from the trainer's own subjects; and they plan into head examples
whose evidence lies in the document, as any training family does."""

from __future__ import annotations

import random

import pytest

from pflash_lab.corpus.cases import corpus_paragraphs, token_counter
from pflash_lab.corpus.families import FAMILIES
from pflash_lab.corpus.paraphrase import SUBJECTS, Concept, draw_value, statement_pattern
from pflash_lab.corpus.wording import shared_words
from pflash_lab.train.head import scoring_config
from pflash_lab.train.head_corpus import HEAD_FAMILIES, case_for, examples, split_paragraphs
from pflash_lab.train.paraphrase_pairs import TRAIN_SUBJECTS

EMBEDDED = "embedded:smollm2-135m"


def _sentences(subjects) -> set[str]:
    return {t for s in subjects for c in s.concepts for t in c.statements + c.questions}


def _states(paragraph: str, subjects) -> bool:
    return any(
        statement_pattern(t).match(paragraph)
        for s in subjects
        for c in s.concepts
        for t in c.statements
    )


@pytest.fixture(scope="module")
def count(smollm2_tokenizer):
    return token_counter(smollm2_tokenizer)


def test_training_wordings_share_no_sentence_subject_or_concept_with_the_bench():
    assert not _sentences(TRAIN_SUBJECTS) & _sentences(SUBJECTS)
    assert not {s.key for s in TRAIN_SUBJECTS} & {s.key for s in SUBJECTS}
    bench_concepts = {c.key for s in SUBJECTS for c in s.concepts}
    assert not {c.key for s in TRAIN_SUBJECTS for c in s.concepts} & bench_concepts
    bench_nouns = {n for s in SUBJECTS for n in s.nouns}
    assert not {n for s in TRAIN_SUBJECTS for n in s.nouns} & bench_nouns


def test_paraphrase_pairs_is_a_training_family_and_not_a_bench_family():
    assert "paraphrase_pairs" in HEAD_FAMILIES
    assert "paraphrase_pairs" not in FAMILIES


@pytest.mark.parametrize("seed", range(6))
def test_a_paraphrase_pairs_case_states_only_training_facts_on_its_text_split(seed, count):
    case = case_for("paraphrase_pairs", seed, 1536, "train", count)
    (turn,) = case.turns
    (evidence,) = turn.evidence
    assert _states(evidence, TRAIN_SUBJECTS)
    assert turn.answers[0] in evidence
    assert not shared_words(turn.question, evidence)
    train_text, corpus = set(split_paragraphs("train")), set(corpus_paragraphs())
    inserted = [p for p in case.document.split("\n\n") if p not in corpus]
    assert len(inserted) >= 12  # the asked fact is one of many of its shape
    assert all(_states(p, TRAIN_SUBJECTS) for p in inserted)
    assert not any(_states(p, SUBJECTS) for p in inserted)
    hay = [p for p in case.document.split("\n\n") if p in corpus]
    assert hay and all(p in train_text for p in hay)


def test_paraphrase_pairs_plan_into_head_examples_with_evidence_in_the_document(
    smollm2_tokenizer,
):
    config = scoring_config(EMBEDDED, 8)
    exs = examples(
        ("paraphrase_pairs",),
        3,
        text="train",
        stream=0,
        seed=0,
        tokenizer=smollm2_tokenizer,
        config=config,
        lengths=(1024,),
    )
    assert [e.family for e in exs] == ["paraphrase_pairs"] * 3
    for e in exs:
        (span,) = e.evidence
        assert e.context.begin <= span.begin < span.end <= e.context.end
        assert e.context.end <= e.query.begin


def test_a_spent_value_range_is_an_error_not_a_hang():
    tiny = Concept("tiny", ("{entity} has {value}.",), ("How many?",), low=1, high=3)
    taken: set[str] = set()
    rng = random.Random(0)
    assert sorted(draw_value(tiny, rng, taken) for _ in range(3)) == ["1", "2", "3"]
    with pytest.raises(ValueError, match="no fresh value"):
        draw_value(tiny, rng, taken)
