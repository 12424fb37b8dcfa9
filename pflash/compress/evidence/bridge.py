"""The second hop: passages about the entity the question's own passage names (a bridge).

Why: "Where was the director of The Tallow Moon educated?" needs two passages. The first
("The Tallow Moon was directed by Mara Quell.") names the work the question names and is
found by the question's words; the second ("Quell studied at Velloran College.") is about
the director, shares no word with the question, and the sentence embedder ranks it among
every other "studied at" sentence of the text, so the second hop often falls out of the
budget (the bench's two_hop family). Entity feedback (`entity_feedback`) follows
the entity whose passages score best together, which is the question's own entity, not the
one its passage brings in. Here the best passages that name a name of the question (hop 1)
are read for the names the question lacks (the bridge: the last such name of each run of
names, "Quell" of "Mara Quell", the way later sentences name a person), and the passages
naming the bridge and stating a fact (a number or another name) are lifted, those about the
bridge's own entity first (not another person of the same surname), then those naming
most of its run of names, then the best-scoring, to just above the level entity feedback
lifts to (`lift_groups`). Why the entity first: a 32K text of the family holds other
Larkspurs and other Aurels, and by score alone "The grave of Aurel Larkspur lies in
Quarnby." came ninth of the passages naming "Larkspur"; in another, "Quell passed the early
years of life in Istrabel." came seventh of ten, behind facts about Dorian, Aurel and Mara
Quell.

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

from pflash.compress.evidence.entity_feedback import names
from pflash.compress.evidence.words import STOPWORDS
from pflash.compress.text.sentences import opens_sentence

# above entity feedback's `LIFT`: a question's own entity is followed for every signal, and
# its lifted passages (the works of the same name, 0.9 of the best) otherwise tie with the
# second hop and win by position, which can leave the second hop out of a short prompt
BRIDGE_LIFT = 0.95
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
    `hop1_passages` scoring above 0 that name most of the names of `question`, best
    first) with `max_lifted` other passages of each bridge name it contributes
    (`bridge_names`) that state something beyond the names (`adds_fact`): those about the
    bridge's own entity first (`same_entity`: "Quell" or "Ysolde Quell", not "Mara Quell",
    where a long text has other Quells), then those naming most of its run of names, then
    the best-scoring. Empty when the question names nothing, no passage names it, or its
    passages name nothing else the text repeats."""
    values = np.asarray(values, dtype=np.float64)
    if len(texts) != values.shape[0]:
        raise ValueError(f"{values.shape[0]} scores for {len(texts)} passages")
    asked = question_names(question)
    if not asked or float(values.max(initial=0.0)) <= 0.0:
        return []
    named = [(len(asked & set(_NAME.findall(t))), float(values[i])) for i, t in enumerate(texts)]
    naming = [i for i, (n, v) in enumerate(named) if n and v > 0]
    # the passages naming most of the question's names first ("The Velvet Frontier", not
    # "The Winter Frontier"), then by score
    hop1 = sorted(naming, key=lambda i: (-named[i][0], -named[i][1]))[:hop1_passages]
    if not hop1:
        return []
    found = names(texts, max_share, MIN_PASSAGES)
    groups = []
    for i in hop1:
        for name in bridge_names(texts[i], asked, found):
            run = next(set(r) for r in _runs(texts[i]) if name in r)
            others = [j for j in found[name] if j != i and adds_fact(texts[j], run | asked)]
            # the bridge's own entity first ("Ysolde Quell", "Quell"; not "Mara Quell"), then
            # the passages naming most of its run, then by score
            others.sort(
                key=lambda j: (
                    not same_entity(texts[j], name, run),
                    -len(run & set(_NAME.findall(texts[j]))),
                    -values[j],
                )
            )
            groups.append([i, *others[:max_lifted]])
    return groups


def same_entity(text: str, name: str, run: set[str]) -> bool:
    """Whether `text` names the bridge `name` as the entity of the bridge's `run` of names: in
    some run of its own holding `name` whose other words (stop words aside) are all in
    `run`. "Quell passed the early years of life in Istrabel." and "The grave of Ysolde
    Quell ..." name Ysolde Quell; "Mara Quell studied at Pyrford Lyceum." names another
    Quell. Why: a long text repeats surnames and first names across people (a 32K two_hop
    case had 10 passages naming "Quell", of five people), and by score the other people's
    facts outranked the one asked for."""
    for r in _runs(text):
        if name in r and all(w in run or w.lower() in STOPWORDS for w in r):
            return True
    return False


def adds_fact(text: str, known: set[str]) -> bool:
    """Whether a passage states something beyond the names it is about: a digit, or a
    capitalised word not opening a sentence or line and not in `known` (the bridge's run
    of names and the question's names). Why: "Quell is a native of Tavisham." answers a
    second hop; "Mara Quell worked with a small circle of collaborators." only names Quell,
    and the embedder scored such a sentence above the answer (the question's "artist who
    painted" is closer to a career than to a birthplace), so that it took the last of a 2K
    budget."""
    if any(c.isdigit() for c in text):
        return True
    return any(
        m.group() not in known and not opens_sentence(text, m.start()) for m in _NAME.finditer(text)
    )


def lift_groups(values: np.ndarray, groups: Sequence[Sequence[int]]) -> np.ndarray:
    """Per-passage scores (float64) where each passage of `groups` scores
    `BRIDGE_LIFT * top + (1 - BRIDGE_LIFT) * own` (top: the best passage's score): above
    every passage entity feedback lifts, at most the best, and in the order of their own
    scores. Why their own order: lifted to one level, passages tie and the earliest wins
    the last of the budget; a person's entry opens with the sentence naming them in full,
    not with the one the question asks about."""
    out = np.asarray(values, dtype=np.float64).copy()
    top = float(out.max(initial=0.0))
    if top <= 0.0:
        return out
    for group in groups:
        g = list(group)
        out[g] = np.maximum(out[g], BRIDGE_LIFT * top + (1.0 - BRIDGE_LIFT) * out[g])
    return out


def lift_second_hop(texts: Sequence[str], values: np.ndarray, question: str) -> np.ndarray:
    """Per-passage scores (float64): `lift_groups` of `second_hop`; unchanged when it
    finds no bridge."""
    return lift_groups(values, second_hop(texts, values, question))
