"""Entity feedback: a question about one entity that does not name it finds the entity's
other facts through the names its best passages carry (pure functions, no model)."""

from __future__ import annotations

import numpy as np
import pytest

from pflash.compress.evidence.entity_feedback import lift_named_entities, names

FACTS = [
    "The staff of Kunlun numbers 7176.",
    "Kunlun took in revenue of 15317 thousand euros.",
    "The Kunlun chain counts 54 shops.",
    "Kunlun was started by Sabine Nextreil.",
]
OTHERS = [
    "The hull of the vessel Rirtmur is 240 metres long.",
    "Every month the Doultheix tenant pays 1598 credits.",
    "The Doultheix tenancy lasts 103 months from signing.",
    "A crew of 140 mans the vessel Rirtmur.",
    "Every so often the caches are cleared for testing.",
    "Clear the caches (for debugging or testing).",
    "The Rirtmur returns to port between expeditions.",
    "Doultheix holders lodge 9168 credits up front.",
]


def test_a_name_is_capitalised_never_lower_case_and_not_only_opening_sentences():
    found = names(FACTS + OTHERS, max_share=1.0)
    assert found["Kunlun"] == [0, 1, 2, 3]
    assert "Every" not in found  # opens sentences only
    assert "The" not in found and "Clear" not in found  # also written in lower case
    assert "Sabine" not in found  # one passage is not an entity the text is about


def test_the_entity_whose_passages_answer_best_together_is_lifted():
    texts = FACTS + OTHERS
    # one fact answers well; the others score below near misses about other entities
    values = np.array([0.6, 1.0, 0.55, 0.5] + [0.7, 0.9, 0.65, 0.7, 0.0, 0.0, 0.68, 0.1])
    out = lift_named_entities(texts, values, max_share=1.0)
    assert out[:4].min() >= 0.9  # every Kunlun fact now ranks above every near miss
    assert np.array_equal(out[4:], values[4:])  # nothing else moves
    assert np.all(out >= values)


def test_a_name_whose_passages_score_poorly_on_average_is_not_followed():
    texts = ["Raises ValueError when empty.", "A ValueError here.", "Else a ValueError.", "x y"]
    values = np.array([0.1, 0.2, 0.3, 1.0])
    assert np.array_equal(lift_named_entities(texts, values, max_share=1.0), values)


@pytest.mark.parametrize("values", [np.zeros(12), np.full(12, -0.5)])
def test_nothing_above_zero_changes_nothing(values):
    assert np.array_equal(lift_named_entities(FACTS + OTHERS, values, max_share=1.0), values)


def test_scores_and_passages_must_match():
    with pytest.raises(ValueError, match="3 scores for 12 passages"):
        lift_named_entities(FACTS + OTHERS, np.zeros(3))
