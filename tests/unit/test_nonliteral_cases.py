"""Non-literal families: the question shares no content word with its evidence (over every
wording pair of the resources, over each described function's whole source and over
generated cases), several wordings are really used, the asked fact is one of many facts of
the same shape yet stated once, and the cases keep the contracts of every family
(deterministic, near the requested length, evidence in the document, answers in the
evidence, every value once)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter

import pytest

from pflash.compress.evidence.words import STOPWORDS as LEXICAL_STOPWORDS
from pflash.compress.render.chat import render_chat
from pflash_lab.corpus.cases import CaseSpec, SuitePlan, corpus_paragraphs, token_counter
from pflash_lab.corpus.code_descriptions import (
    CODE_QUESTION_FRAMES,
    DESCRIBED_FUNCTIONS,
    FunctionDescription,
    usable_descriptions,
)
from pflash_lab.corpus.families import FAMILIES, generate
from pflash_lab.corpus.nonliteral import described_functions, distractor_count
from pflash_lab.corpus.paraphrase import AGGREGATE_FRAMES, ORGANISATION, SUBJECTS, statement_pattern
from pflash_lab.corpus.wording import STOPWORDS, same_word, shared_words
from pflash_lab.train.paraphrase_pairs import TRAIN_SUBJECTS

NONLITERAL = ("paraphrased_needle", "described_code", "multi_turn_paraphrase", "aggregation")
FACT_FAMILIES = ("paraphrased_needle", "multi_turn_paraphrase", "aggregation")
SEEDS = range(24)


# Every statement template as a pattern, with its concept key: which concept a sentence states.
STATEMENT_PATTERNS = [
    (concept.key, statement_pattern(t))
    for subject in SUBJECTS
    for concept in subject.concepts
    for t in concept.statements
]


def parse_facts(paragraph: str) -> set[tuple[str, str, str]]:
    """Every (concept key, entity, value) reading of a paragraph by the statement templates:
    exactly one for a fact sentence, none for corpus text."""
    return {
        (key, m["entity"], m["value"])
        for key, pattern in STATEMENT_PATTERNS
        if (m := pattern.match(paragraph))
    }


def concepts_stated(paragraph: str) -> set[str]:
    return {key for key, _, _ in parse_facts(paragraph)}


def concept_value(paragraph: str) -> str:
    return next(iter(parse_facts(paragraph)))[2]


@pytest.fixture(scope="module")
def count(smollm2_tokenizer):
    return token_counter(smollm2_tokenizer)


@pytest.fixture(scope="module")
def cases(count):
    """Every non-literal family over `SEEDS` (short documents: wording does not depend on
    the length, and described code needs room for its module)."""
    lengths = {"described_code": 3072}
    return {
        family: [
            generate(CaseSpec(family, seed, lengths.get(family, 1024)), count) for seed in SEEDS
        ]
        for family in NONLITERAL
    }


def _inserted(case) -> list[str]:
    corpus = set(corpus_paragraphs())
    return [p for p in case.document.split("\n\n") if p not in corpus]


# --------------------------------------------------------------------------- the resources


def test_stem_check_catches_inflections_and_keeps_other_words_apart():
    assert same_word("located", "locations") and same_word("employed", "employees")
    assert same_word("days", "day") and same_word("week", "weekday")
    assert not same_word("branches", "brand") and not same_word("sit", "site")


def test_every_word_the_check_ignores_is_ignored_by_the_lexical_anchors_too():
    # else a question word that "shares nothing" with its evidence can still anchor it
    # ("Among the definitions above" found a docstring saying "matches among the ...")
    assert STOPWORDS <= LEXICAL_STOPWORDS


# the bench's word resource, and the head trainer's own (held apart from it)
RESOURCES = pytest.mark.parametrize("subjects", [SUBJECTS, TRAIN_SUBJECTS], ids=["bench", "train"])


@RESOURCES
def test_no_question_wording_shares_a_content_word_with_any_statement_of_its_concept(subjects):
    for subject in subjects:
        for concept in subject.concepts:
            assert len(concept.statements) >= 3 and len(concept.questions) >= 3, concept.key
            for statement in concept.statements:
                for question in concept.questions:
                    for noun in subject.nouns:
                        asked = question.format(noun=noun)
                        assert not shared_words(asked, statement), (asked, statement)


@RESOURCES
def test_question_nouns_never_appear_in_statements(subjects):
    for subject in subjects:
        for concept in subject.concepts:
            for statement in concept.statements:
                for noun in subject.nouns:
                    assert not shared_words(noun, statement), (noun, statement)


def test_aggregation_questions_share_no_word_with_any_organisation_statement():
    statements = [s for c in ORGANISATION.concepts for s in c.statements]
    questions = [q for c in ORGANISATION.concepts for q in c.questions]
    frames = [f.format(noun="", questions="") for f in AGGREGATE_FRAMES]
    for asked in questions + frames:
        for noun in ORGANISATION.nouns:
            for statement in statements:
                assert not shared_words(asked.replace("{noun}", noun), statement), (
                    asked,
                    statement,
                )


def test_enough_described_functions_resolve_and_keep_clean_descriptions_in_this_stdlib():
    resolved = described_functions()
    assert len(resolved) >= 45
    assert len(resolved) >= 0.85 * len(DESCRIBED_FUNCTIONS)
    kept = sum(len(d.descriptions) for d, _ in resolved)
    assert kept >= 0.85 * sum(len(d.descriptions) for d in DESCRIBED_FUNCTIONS)


def test_no_usable_description_shares_a_word_with_anything_in_its_functions_source():
    for desc, func in described_functions():
        for description in desc.descriptions:
            for frame in CODE_QUESTION_FRAMES:
                asked = frame.format(description=description)
                assert not shared_words(asked, func.source), (func.name, asked)


def test_a_description_sharing_a_word_with_the_body_is_dropped():
    desc, func = described_functions()[0]
    body_word = sorted(re.findall(r"[a-z]{6,}", func.source.split("\n", 1)[1]))[0]
    probe = FunctionDescription(desc.module, desc.name, (*desc.descriptions, f"uses {body_word}"))
    assert usable_descriptions(probe, func.source) == desc.descriptions


# --------------------------------------------------------------------------- generated cases


@pytest.mark.parametrize("family", NONLITERAL)
def test_families_are_registered_and_the_same_spec_gives_the_same_case(family, count):
    assert family in FAMILIES
    spec = CaseSpec(family, 11, 2048)
    assert generate(spec, count) == generate(spec, count)


@pytest.mark.parametrize("family", NONLITERAL)
def test_no_generated_question_shares_a_content_word_with_its_evidence(family, cases):
    for case in cases[family]:
        for turn in case.turns:
            for evidence in turn.evidence:
                shared = shared_words(turn.question, evidence, ignore=turn.answers)
                assert not shared, (case.case_id, turn.question, evidence, shared)


@pytest.mark.parametrize("family", NONLITERAL)
def test_evidence_is_in_the_document_and_each_answer_in_its_evidence(family, cases):
    for case in cases[family]:
        for turn in case.turns:
            assert turn.answers and len(turn.answers) == len(set(turn.answers))
            for evidence in turn.evidence:
                assert case.document.count(evidence) == 1, (case.case_id, evidence)
            for answer in turn.answers:
                assert any(answer in e for e in turn.evidence)
                assert answer.lower() not in turn.question.lower()


@pytest.mark.parametrize("family", FACT_FAMILIES)
def test_every_fact_value_occurs_once_in_the_document(family, cases):
    for case in cases[family]:
        values = [concept_value(p) for p in _inserted(case)]
        assert len(values) == len(set(values)), case.case_id
        for value in values:
            hits = re.findall(rf"\b{re.escape(value)}\b", case.document)
            assert len(hits) == 1, (case.case_id, value)
        assert all(a in values for t in case.turns for a in t.answers)


@pytest.mark.parametrize("family", FACT_FAMILIES)
def test_the_asked_fact_is_one_of_many_facts_and_its_concept_is_stated_once(family, cases):
    for case in cases[family]:
        facts = _inserted(case)
        asked = [e for t in case.turns for e in t.evidence]
        assert len(facts) >= len(asked) + distractor_count(case.spec.length), case.case_id
        stated = Counter()
        for fact in facts:
            concepts = concepts_stated(fact)
            assert len(concepts) == 1, (case.case_id, fact)  # every paragraph added is a fact
            stated.update(concepts)
        for evidence in asked:
            (concept,) = concepts_stated(evidence)
            assert stated[concept] == 1, (case.case_id, concept)
        assert len(stated) >= 8  # the distractors cover many concepts, not one repeated


def test_distractor_facts_grow_with_the_length(count):
    lengths = (2048, 4096, 7000)
    counts = [
        len(_inserted(generate(CaseSpec("paraphrased_needle", 5, n), count))) for n in lengths
    ]
    assert counts[0] >= distractor_count(2048) + 1 >= 20
    assert counts[0] < counts[1] < counts[2]
    assert counts[2] >= distractor_count(7000) + 1 >= 60


def test_multi_turn_paraphrase_asks_three_facts_lying_apart(cases, count):
    for case in cases["multi_turn_paraphrase"]:
        assert len(case.turns) == 3
        assert len({t.answers[0] for t in case.turns}) == 3
    for seed in range(4):  # long enough for paragraph boundaries to resolve the depths
        case = generate(CaseSpec("multi_turn_paraphrase", seed, 4096), count)
        where = sorted(case.document.index(t.evidence[0]) / len(case.document) for t in case.turns)
        assert where[0] < 0.35 < where[1] < 0.65 < where[2], (case.case_id, where)


def test_aggregation_asks_five_facts_of_one_entity_in_one_question(cases):
    for case in cases["aggregation"]:
        (turn,) = case.turns
        assert len(turn.evidence) == len(set(turn.answers)) == 5
        assert set(turn.evidence) <= set(_inserted(case))
        assert turn.question.count("?") == 5
        readings = [next(iter(parse_facts(e))) for e in turn.evidence]
        assert {key for key, _, _ in readings} <= {c.key for c in ORGANISATION.concepts}
        assert len({entity for _, entity, _ in readings}) == 1


def test_described_code_asks_a_real_function_defined_once(cases):
    for case in cases["described_code"]:
        (turn,) = case.turns
        (name,) = turn.answers
        assert turn.evidence[0].startswith(f"def {name}(")  # the whole function, as written
        assert turn.evidence[0] in case.document and turn.evidence[0].count("\n") >= 3
        assert len(re.findall(rf"^def {re.escape(name)}\(", case.document, re.M)) == 1
        assert name in {f.name for _, f in described_functions()}


@pytest.mark.parametrize("family", NONLITERAL)
def test_several_wordings_are_used_across_seeds(family, cases):
    questions = Counter(t.question for c in cases[family] for t in c.turns)
    assert len(questions) >= 0.6 * sum(questions.values())
    if family != "described_code":
        statements = Counter(
            re.sub(r"[A-Z]\w+|\d+", "_", e)
            for c in cases[family]
            for t in c.turns
            for e in t.evidence
        )
        assert len(statements) >= 8, statements
    frames = {q.split(" ")[0] for q in questions}
    assert len(frames) >= 2


@pytest.mark.parametrize("family", NONLITERAL)
@pytest.mark.parametrize("length", [2048, 7000])
def test_rendered_prompt_length_is_near_the_request(family, length, count, smollm2_tokenizer):
    case = generate(CaseSpec(family, 3, length), count)
    messages = case.messages(len(case.turns) - 1, ["ok"] * len(case.turns))
    n = count(render_chat(smollm2_tokenizer, messages))
    assert 0.92 * length <= n <= 1.03 * length + 64 * (len(case.turns) - 1), n


def test_paraphrased_needle_depth_zero_and_one_put_the_fact_first_and_last(count):
    first = generate(CaseSpec("paraphrased_needle", 9, 1024, 0.0), count)
    last = generate(CaseSpec("paraphrased_needle", 9, 1024, 1.0), count)
    assert first.document.split("\n\n")[0] == first.turns[0].evidence[0]
    assert last.document.split("\n\n")[-1] == last.turns[0].evidence[0]


def test_suite_plan_spreads_depths_for_paraphrased_needles_only():
    specs = SuitePlan(NONLITERAL, 3, (2048,)).specs()
    depths = {s.family: [] for s in specs}
    for s in specs:
        depths[s.family].append(s.depth)
    assert depths["paraphrased_needle"] == [0.0, 0.5, 1.0]
    assert all(d is None for f in NONLITERAL[1:] for d in depths[f])


def test_nonliteral_module_imports_on_its_own():
    code = (
        "import pflash_lab.corpus.nonliteral as n; from pflash_lab.corpus.families import FAMILIES; "
        "assert FAMILIES['aggregation'] is n.aggregation"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
