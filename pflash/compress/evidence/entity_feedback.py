"""Entity feedback: the passages naming the entity the question is about are lifted.

Why: a question about one entity often does not name it ("About the firm described above:
who founded it? How large is its staff?"). The sentence embedder ranks each fact well for
its own part of the question, but a short fact naming the firm competes with near-miss
sentences about other firms, vessels and leases, and several facts rank too low for the
budget (the bench's aggregation family). Together, though, the passages naming the firm
answer the question better than those naming any other name: the sum of a name's passage
scores picks the entity out. This is the pseudo-relevance feedback of classic retrieval,
restricted to names so that it follows an entity, not a topic. It only ever raises scores,
and only for a name whose passages score well on average (`MIN_MEAN` of the best passage):
an exception name scattered through code (`ValueError`, whose passages score well under that
in a described-code case) is not followed, and a question not about an entity pays nothing.

A name is a capitalised word (`Kunlun`, `McAllister`) that appears at least once other than
at the start of a sentence or line, never in lower case, and in at least `MIN_PASSAGES` and
at most `MAX_SHARE` of the passages: "Every" or "The" open sentences, "every" is written in
lower case too, an entity the question is about has several facts, and a name in every
passage picks nothing out.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from pflash.compress.text.sentences import opens_sentence

LIFT = 0.9  # a lifted passage scores at least this share of the best passage
NEAR = 0.9  # names whose summed score is within this share of the best name's are followed
MIN_MEAN = 0.5  # a followed name's passages score at least this share of the best on average
MIN_PASSAGES = 3
MAX_SHARE = 0.1
_NAME = re.compile(r"\b[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*\b")
_LOWER_WORD = re.compile(r"\b[a-z][a-z0-9]*\b")


def names(
    texts: Sequence[str], max_share: float = MAX_SHARE, min_passages: int = MIN_PASSAGES
) -> dict[str, list[int]]:
    """Each name (see the module docstring) in at least `min_passages` passages and the
    passages it appears in, source order."""
    lower = {w for t in texts for w in _LOWER_WORD.findall(t)}
    where: dict[str, set[int]] = defaultdict(set)
    inside: set[str] = set()  # seen at least once other than opening a sentence
    for i, text in enumerate(texts):
        for m in _NAME.finditer(text):
            name = m.group()
            if name.lower() in lower:
                continue
            where[name].add(i)
            if name not in inside and not opens_sentence(text, m.start()):
                inside.add(name)
    limit = max(min_passages, int(max_share * len(texts)))
    return {
        n: sorted(ps) for n, ps in where.items() if n in inside and min_passages <= len(ps) <= limit
    }


def followed_passages(
    texts: Sequence[str],
    values: np.ndarray,
    *,
    near: float = NEAR,
    max_share: float = MAX_SHARE,
) -> list[list[int]]:
    """The passages of each name followed for these per-passage scores: the best name (the
    highest sum of its passages' scores among names whose passages average at least
    `MIN_MEAN` of the best passage) and the names within `near` of it. Empty when no name
    qualifies or nothing scores above 0."""
    values = np.asarray(values, dtype=np.float64)
    if len(texts) != values.shape[0]:
        raise ValueError(f"{values.shape[0]} scores for {len(texts)} passages")
    top = float(values.max(initial=0.0))
    found = names(texts, max_share)
    if top <= 0.0 or not found:
        return []
    weight = {
        name: float(values[passages].sum())
        for name, passages in found.items()
        if float(values[passages].mean()) >= MIN_MEAN * top
    }
    best = max(weight.values(), default=0.0)
    return [
        passages for name, passages in found.items() if weight.get(name, 0.0) >= near * best > 0.0
    ]


def lift_passages(values: np.ndarray, groups: Sequence[Sequence[int]], lift: float = LIFT):
    """Per-passage scores (float64) where every passage of `groups` scores at least `lift`
    times the best passage."""
    out = np.asarray(values, dtype=np.float64).copy()
    top = float(out.max(initial=0.0))
    for passages in groups:
        out[list(passages)] = np.maximum(out[list(passages)], lift * top)
    return out


def lift_named_entities(
    texts: Sequence[str],
    values: np.ndarray,
    *,
    lift: float = LIFT,
    near: float = NEAR,
    max_share: float = MAX_SHARE,
) -> np.ndarray:
    """Per-passage scores (float64, same shape) where every passage naming a followed name
    (`followed_passages`) scores at least `lift` times the best passage. Unchanged when no
    name qualifies or nothing scores above 0."""
    groups = followed_passages(texts, values, near=near, max_share=max_share)
    return lift_passages(values, groups, lift)
