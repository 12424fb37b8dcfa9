"""The second hop: passages about the entity the question's own passage names (a bridge).

Why: "Where was the director of The Tallow Moon educated?" needs two passages. The first
("The Tallow Moon was directed by Mara Quell.") names the work the question names and is
found by the question's words; the second ("Quell studied at Velloran College.") is about
the director, shares no word with the question, and the sentence embedder ranks it among
every other "studied at" sentence of the text: in the bench's two_hop family the second hop
fell out of the budget in about half the cases. Entity feedback (`entity_feedback`) follows
the entity whose passages score best together, which is the question's own entity, not the
one its passage brings in. Here the best passages that name a name of the question (hop 1)
are read for the names the question lacks (the bridge: the last such name of each run of
names, "Quell" of "Mara Quell", the way later sentences name a person), and the best-scoring
passages naming the bridge are lifted, as entity feedback lifts (`lift_passages`).

Bounded and cheap: a scan of the passages for names (linear), no model call; at most
`HOP1_PASSAGES` passages are read and `MAX_LIFTED` passages lifted, and scores only rise.
A question that names nothing (the paraphrased and aggregation families: "the firm
described above") changes nothing; one whose best passage names nothing else changes
nothing. A one-hop question about a named entity may lift up to `MAX_LIFTED` passages about
a name its answer passage carries ("Quell was born in Tavisham": other passages naming
Tavisham), a few passages of the budget.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from pflash.compress.entity_feedback import LIFT, names
from pflash.compress.lexical import STOPWORDS
from pflash.compress.sentences import opens_sentence

HOP1_PASSAGES = 3  # the best passages naming the question's names, read for the bridge
MAX_LIFTED = 3  # per bridge name: its best-scoring passages lifted
MIN_PASSAGES = 2  # a bridge name is in the hop-1 passage and at least one other
MAX_SHARE = 0.1  # ... and in at most this share of the passages (a name everywhere picks nothing)
_NAME = re.compile(r"\b[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*\b")


def question_names(question: str) -> set[str]:
    """Capitalised words of the question other than one opening a sentence or line, minus
    stop words ("The" of "The Tallow Moon"): the names the question states."""
    return {
        m.group()
        for m in _NAME.finditer(question)
        if m.group().lower() not in STOPWORDS and not opens_sentence(question, m.start())
    }


def _runs(text: str) -> list[list[str]]:
    """The runs of capitalised words (`_NAME`) separated by one space, in order: "Mara
    Quell", "The Tallow Moon"."""
    runs: list[list[str]] = []
    end = -2
    for m in _NAME.finditer(text):
        if runs and m.start() == end + 1 and text[end] == " ":
            runs[-1].append(m.group())
        else:
            runs.append([m.group()])
        end = m.end()
    return runs


def bridge_names(hop1: str, asked: set[str], found: dict[str, list[int]]) -> list[str]:
    """The bridge a hop-1 passage contributes: per run of names, its last word that is a
    name of the text (`found`) and not one of the question's (`asked`)."""
    out = []
    for run in _runs(hop1):
        last = [w for w in run if w in found and w not in asked]
        if last and last[-1] not in out:
            out.append(last[-1])
    return out


def second_hop(
    texts: Sequence[str],
    values: np.ndarray,
    question: str,
    *,
    hop1_passages: int = HOP1_PASSAGES,
    max_lifted: int = MAX_LIFTED,
    max_share: float = MAX_SHARE,
) -> list[list[int]]:
    """Groups of passages to lift for these per-passage scores: each hop-1 passage (of the
    best `hop1_passages` naming a name of `question`, scoring above 0) with the
    best-scoring `max_lifted` other passages of each bridge name it contributes
    (`bridge_names`). Empty when the question names nothing, no passage names it, or its
    passages name nothing else the text repeats."""
    values = np.asarray(values, dtype=np.float64)
    if len(texts) != values.shape[0]:
        raise ValueError(f"{values.shape[0]} scores for {len(texts)} passages")
    asked = question_names(question)
    if not asked or float(values.max(initial=0.0)) <= 0.0:
        return []
    naming = [i for i, t in enumerate(texts) if values[i] > 0 and asked & set(_NAME.findall(t))]
    hop1 = sorted(naming, key=lambda i: -values[i])[:hop1_passages]
    if not hop1:
        return []
    found = names(texts, max_share, MIN_PASSAGES)
    groups = []
    for i in hop1:
        for name in bridge_names(texts[i], asked, found):
            others = sorted((j for j in found[name] if j != i), key=lambda j: -values[j])
            groups.append([i, *others[:max_lifted]])
    return groups


def lift_second_hop(texts: Sequence[str], values: np.ndarray, question: str) -> np.ndarray:
    """Per-passage scores (float64) where every passage of `second_hop` scores at least
    `LIFT` times the best passage; unchanged when it finds no bridge."""
    out = np.asarray(values, dtype=np.float64).copy()
    top = float(out.max(initial=0.0))
    for group in second_hop(texts, out, question):
        out[group] = np.maximum(out[group], LIFT * top)
    return out
