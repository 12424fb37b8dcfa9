"""The two_hop family: the hop-2 sentence shares no content word with any question of its
chain, both supporting sentences are in the document once, the hop-1 sentence names the work
the question names and the maker the hop-2 sentence is about, and the distractors share the
question's words."""

from __future__ import annotations

import random
import re

import pytest

from pflash_lab.corpus.cases import CaseSpec, token_counter
from pflash_lab.corpus.families import FAMILIES, generate
from pflash_lab.corpus.two_hop import ATTRIBUTES, CHAINS, LINKS
from pflash_lab.corpus.wording import shared_words

SEEDS = range(24)


@pytest.fixture(scope="module")
def count(smollm2_tokenizer):
    return token_counter(smollm2_tokenizer)


@pytest.fixture(scope="module")
def cases(count):
    return [generate(CaseSpec("two_hop", seed, 2048), count) for seed in SEEDS]


def test_the_resource_has_at_least_fifteen_chains_each_asked_several_ways():
    assert len(CHAINS) >= 15
    for link, attr in CHAINS:
        assert len(link.roles) * len(attr.questions) >= 4, (link.key, attr.key)


def test_no_hop_two_wording_shares_a_content_word_with_any_question_of_its_chain():
    for link in LINKS:
        for attr in ATTRIBUTES:
            for role in link.roles:
                for question in attr.questions:
                    asked = question.format(role=role.format(work=""))
                    for statement in attr.statements:
                        hop2 = statement.format(person="", value="")
                        assert not shared_words(asked, hop2), (asked, statement)


def test_family_is_registered_and_the_same_spec_gives_the_same_case(count):
    assert "two_hop" in FAMILIES
    spec = CaseSpec("two_hop", 9501, 2048)
    assert generate(spec, count) == generate(spec, count)


def test_both_supporting_sentences_are_in_the_document_once_and_the_answer_in_hop_two(cases):
    for case in cases:
        (turn,) = case.turns
        assert len(turn.evidence) == 2, case.case_id
        for sentence in turn.evidence:
            assert case.document.count(sentence) == 1, (case.case_id, sentence)
        assert turn.answers[0] in turn.evidence[1], case.case_id
        assert turn.answers[0] not in turn.evidence[0], case.case_id


def test_generated_hop_two_shares_no_content_word_with_the_question(cases):
    for case in cases:
        (turn,) = case.turns
        assert not shared_words(turn.question, turn.evidence[1]), case.case_id
        # ...while hop 1 shares the work's name (the question's own words)
        assert shared_words(turn.question, turn.evidence[0]), case.case_id


def test_hop_one_names_the_maker_hop_two_is_about_and_the_question_does_not(cases):
    for case in cases:
        (turn,) = case.turns
        hop1, hop2 = turn.evidence
        first, last = hop1.rstrip(".").split()[-2:]  # every hop-1 wording ends with the maker
        assert last in hop2.split(), case.case_id
        assert last not in turn.question and first not in turn.question, case.case_id
        # the surname an entry may use alone is no other person's of the case
        before = {m.group(1) for m in re.finditer(rf"(\w+) {last}\b", case.document)}
        assert {w for w in before if w[0].isupper()} <= {first}, case.case_id


def test_distractors_share_the_questions_words_and_the_answer_is_stated_once(cases):
    for case in cases:
        (turn,) = case.turns
        paragraphs = case.document.split("\n\n")
        near = [p for p in paragraphs if p not in turn.evidence and shared_words(turn.question, p)]
        assert len(near) >= 3, case.case_id
        assert case.document.count(turn.answers[0]) == 1, case.case_id


def test_several_chains_and_wordings_are_used_across_seeds(cases):
    assert len({c.turns[0].question.split()[0] for c in cases}) >= 3
    assert len({c.turns[0].evidence[1].split()[-2] for c in cases}) >= 6


def test_every_chain_kind_makes_a_long_case(count):
    # a kind with few names (18 ship names) still fills 7K tokens: names run out, then
    # carry a numeral, and each is still used once
    seeds = {}
    for seed in range(9600, 9700):
        seeds.setdefault(random.Random(seed).choice(CHAINS)[0].key, seed)
    assert set(seeds) == {link.key for link in LINKS}
    for seed in seeds.values():
        case = generate(CaseSpec("two_hop", seed, 7000), count)
        (turn,) = case.turns
        assert all(case.document.count(e) == 1 for e in turn.evidence), case.case_id
