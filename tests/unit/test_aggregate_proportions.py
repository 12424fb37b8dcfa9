"""The order a "most frequent words" question samples units in (`proportional_order`), and
how many items such a question asks for (`asked_top`)."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from pflash.compress.evidence.aggregate import DEFAULT_TOP, asked_top, classify_question
from pflash.compress.evidence.stratified import bit_reversal_rank, proportional_order

VOCAB = [f"word{i:03d}" for i in range(200)]


def _zipf_sentences(seed: int, n: int = 500) -> list[str]:
    """n sentences of 8-15 words drawn with weight 1/rank: the 3rd and 4th words' counts are
    1/3 and 1/4 of the first's, close enough for a 10% sample to swap them."""
    rng = random.Random(seed)
    weights = [1.0 / (r + 1) for r in range(len(VOCAB))]
    return [" ".join(rng.choices(VOCAB, weights, k=rng.randint(8, 15))) + "." for _ in range(n)]


def _top(units: list[str], k: int = 3) -> set[str]:
    counts = Counter(w for u in units for w in u.rstrip(".").split())
    return {w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:k]}


def _kept_top(order: np.ndarray, units: list[str], share: float = 0.1) -> float:
    sample = [units[i] for i in order[: int(share * len(units))]]
    return len(_top(sample) & _top(units)) / 3


def test_a_proportional_prefix_keeps_the_top_words_where_an_even_sample_swaps_them():
    even, proportional = [], []
    for seed in range(20):
        units = _zipf_sentences(seed)
        sizes = [len(u.split()) for u in units]
        proportional.append(_kept_top(proportional_order(units, sizes, 3), units))
        even.append(_kept_top(np.argsort(bit_reversal_rank(len(units)), kind="stable"), units))
    assert min(proportional) == 1.0
    assert min(even) < 1.0  # the case this order exists for


def test_every_prefix_keeps_the_tracked_words_in_proportion():
    units = _zipf_sentences(7)
    sizes = [len(u.split()) for u in units]
    order = proportional_order(units, sizes, 3)
    assert sorted(order.tolist()) == list(range(len(units)))  # a permutation
    doc = Counter(w for u in units for w in u.rstrip(".").split())
    for share in (0.05, 0.1, 0.2):
        kept = order[: int(share * len(units))]
        sample = Counter(w for i in kept for w in units[i].rstrip(".").split())
        r = sum(sizes[i] for i in kept) / sum(sizes)
        for w, _ in doc.most_common(6):
            assert abs(sample[w] - r * doc[w]) <= max(2.0, 0.1 * r * doc[w]), (share, w)


def test_equal_units_are_taken_spread_over_the_document():
    units = [f"{i}. apple" if i % 2 == 0 else f"{i}. pear" for i in range(64)]
    order = proportional_order(units, [3] * 64, 2)
    first = sorted(order[:8].tolist())
    assert max(first) >= 48 and min(first) < 16  # not a block at the start
    assert Counter(units[i].split()[1] for i in order[:8]) == {"apple": 4, "pear": 4}


def test_no_units_or_no_words_fall_back_to_the_even_order():
    assert proportional_order([], [], 3).size == 0
    units = ["", "  ", "."]
    assert (
        proportional_order(units, [1, 1, 1], 3).tolist()
        == np.argsort(bit_reversal_rank(3), kind="stable").tolist()
    )


@pytest.mark.parametrize(
    ("sentence", "top"),
    [
        ("What are the 3 most frequently used words in the text above?", 3),
        ("Name the three most common words in the passage above.", 3),
        ("List the ten most frequent words in the list.", 10),
        ("What are the top 5 words by frequency?", 5),
        ("Which words appear most often in the text?", DEFAULT_TOP),
    ],
)
def test_the_number_of_items_asked_for_is_read_from_the_question(sentence, top):
    question = classify_question(sentence)
    assert question is not None and question.kind == "frequency"
    assert asked_top(question) == top
