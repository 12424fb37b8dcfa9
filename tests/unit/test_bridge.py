"""The second hop: a question's own passage names a bridge entity, and the passages about
that entity are lifted (pure functions, no model)."""

from __future__ import annotations

import numpy as np
import pytest

from pflash.compress.bridge import (
    bridge_names,
    lift_second_hop,
    question_names,
    second_hop,
)
from pflash.compress.entity_feedback import LIFT

QUESTION = "Which school did the person who directed The Tallow Moon attend?"
TEXTS = [
    "The Tallow Moon is a feature film first presented to the public in 1931.",  # 0
    "The Tallow Moon was directed by Mara Quell.",  # 1: hop 1
    "Reviews of The Tallow Moon were mixed at the time.",  # 2
    "Mara Quell worked with a small circle of collaborators.",  # 3
    "Quell studied at Velloran College.",  # 4: hop 2, no word of the question
    "Letters written by Quell were published in 1970.",  # 5
    "The person who directed The Amber Gate, Olin Varre, attended school at Brisk.",  # 6
    "Olin Varre trained for four years at the Morrow Polytechnic.",  # 7
    "Varre declined most interviews.",  # 8
    "Ivo Whitlock studied at Glennard College.",  # 9
    "Whitlock rarely travelled abroad.",  # 10
    "The license grants permission to copy and distribute the work.",  # 11
]
# a text of 40 passages: a bridge name may be in up to 4 of them (`MAX_SHARE`)
FILLER = [f"the licence clause {k} applies to every copy of the work." for k in range(28)]
TEXTS += FILLER
# the embedder's picture: near misses about other people's schooling outrank the hop 2
VALUES = np.array([0.5, 0.8, 0.45, 0.2, 0.3, 0.1, 1.0, 0.6, 0.05, 0.55, 0.0, 0.0] + [0.0] * 28)
N = len(TEXTS)


def test_question_names_are_its_capitalised_words_but_stop_words_and_the_opening_one():
    assert question_names(QUESTION) == {"Tallow", "Moon"}
    assert question_names("In which year was the firm described above founded?") == set()


def test_the_bridge_is_the_last_new_name_of_each_run_of_names_in_the_hop_one_passage():
    found = {"Tallow": [0, 1, 2], "Moon": [0, 1, 2], "Mara": [1, 3], "Quell": [1, 3, 4, 5]}
    assert bridge_names(TEXTS[1], {"Tallow", "Moon"}, found) == ["Quell"]
    assert bridge_names(TEXTS[0], {"Tallow", "Moon"}, found) == []


def test_the_passages_about_the_bridge_entity_are_lifted_above_the_near_misses():
    out = lift_second_hop(TEXTS, VALUES, QUESTION)
    assert out[4] == pytest.approx(LIFT)  # the hop-2 passage, 7th of 40 before
    assert out[4] > out[7] and out[4] > out[9]  # above the other people's schooling
    assert out[1] >= LIFT  # and the hop-1 passage with it


def test_the_lift_only_raises_and_at_most_the_bounded_number_of_passages():
    out = lift_second_hop(TEXTS, VALUES, QUESTION)
    assert np.all(out >= VALUES)
    raised = np.flatnonzero(out > VALUES).tolist()
    assert raised == [1, 3, 4, 5]  # hop 1 and the three passages naming Quell
    rest = [i for i in range(N) if i not in raised]
    assert np.array_equal(out[rest], VALUES[rest])


def test_a_question_naming_nothing_changes_nothing():
    question = "Where did the author of the novel described above study?"
    assert second_hop(TEXTS, VALUES, question) == []
    assert np.array_equal(lift_second_hop(TEXTS, VALUES, question), VALUES)


def test_a_single_hop_question_whose_passage_names_nothing_new_changes_nothing():
    texts = ["The Kunlun code is 4471.", "Kunlun is based in Ortmund.", *TEXTS[6:]]
    values = np.concatenate([[1.0, 0.5], VALUES[6:]])
    # the answer passage names no one else; Ortmund is in one passage only
    assert second_hop(texts, values, "What is the access code for Kunlun?") == []


@pytest.mark.parametrize("values", [np.zeros(N), np.full(N, -0.5)])
def test_nothing_above_zero_changes_nothing(values):
    assert np.array_equal(lift_second_hop(TEXTS, values, QUESTION), values)


def test_scores_and_passages_must_match():
    with pytest.raises(ValueError, match="3 scores for 40 passages"):
        second_hop(TEXTS, np.zeros(3), QUESTION)
