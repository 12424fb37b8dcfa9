"""The stratified uniform sample that answers a question about the whole document
(`aggregate.py` finds the question and says why a sample answers it: the document's
proportions, which selection by score distorts).

Pure, over the plan's drafter text:

- `stratified_candidates`: candidates that tile the prompt at its units (lines, sentences,
  list items: `lexical.split_units`), scored so that any prefix of their ranking is an
  evenly spread sample (a bit-reversal order of the units). The strict selector, which
  fills by rank whatever the budget of the current ceiling attempt, therefore keeps every
  k-th unit at whatever k the budget allows. Deterministic: no random numbers.
- `stratified_selection`: what strict selection chooses from for an aggregate question:
  those candidates with the question's sentences first, the units that repeat its phrases
  before the rest, the units holding a frequent word in proportion (`frequent_units`,
  `proportional_order`) and a worked example before the material last (`material_start`).
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from pflash.compress.evidence.aggregate import AggregateQuestion, asked_top, asks_most_frequent
from pflash.compress.evidence.anchors import MAX_NGRAM, PHRASE_SCORE
from pflash.compress.evidence.lexical import AnchoredUnit, LexicalEvidence
from pflash.compress.evidence.words import split_units
from pflash.compress.plan.query import Plan
from pflash.compress.selection import Candidates, build_candidates
from pflash.spans import Span

LONG_LINE = 200  # characters: a longer line is sampled by its sentences
MIN_FREQUENT = 3  # units a word must be in, at least, to count as frequent
STRUCTURAL_SHARE = 0.9  # a word nearly every unit holds ("Keyword log entry:") tells none apart
TRACKED_PER_ASKED = 2  # words whose proportions the sample keeps: twice the number asked
GREEDY_SHARE = 0.4  # the share of a tier's units ordered by `proportional_order`

_WORD = re.compile(r"[a-z0-9]+")  # a word as `aggregate` reads one


# ----------------------------------------------------------------------------- the sample


def stratified_selection(
    plan: Plan,
    *,
    pinned: Sequence[Span],
    suffix_candidates: bool,
    evidence: LexicalEvidence | None,
    question: AggregateQuestion | None = None,
) -> tuple[Candidates, LexicalEvidence | None]:
    """What strict selection chooses from for an aggregate question: `stratified_candidates`
    with the question sentences of `evidence` kept first and the units that repeat a phrase
    or a quoted string of the question (lexical evidence's lowest tier: the log lines a
    "which keywords appear most often in the keyword log entries" question counts) sampled
    before the rest; the evidence reduced to its question sentences, so nothing else is
    promoted ahead of the sample. A key anchor ("10" in "the 10 most common words" names a
    list item) is not followed: the question is about all of the document. A question for
    the most frequent items samples the units holding a frequent word first
    (`frequent_units`), in an order that keeps the proportions of the words it ranks
    (`proportional_order`). A worked example of the same question before the material
    (`material_start`) is sampled last."""
    top = asked_top(question) if question is not None and asks_most_frequent(question) else None
    begin = material_start(plan, question) if question is not None else 0
    if evidence is None:
        cands = stratified_candidates(
            plan,
            pinned=pinned,
            suffix_candidates=suffix_candidates,
            frequent_top=top,
            material_begin=begin,
        )
        return cands, None
    cands = stratified_candidates(
        plan,
        pinned=pinned,
        suffix_candidates=suffix_candidates,
        keep=evidence.question,
        focus=tuple(u.span for u in evidence.units if _repeated_phrase(u)),
        frequent_top=top,
        material_begin=begin,
    )
    return cands, replace(evidence, units=())


def material_start(plan: Plan, question: AggregateQuestion) -> int:
    """The drafter token where the text the question is about begins: after the line that
    holds the question sentence's last earlier occurrence in the latest user content, else 0.

    Why: a few-shot prompt shows the task once, worked ("Below is a numbered list ... What
    are the 10 most common words in the above list? Answer: ... 1. goose 2. lifetime"),
    before the real one. That example is not the material: a uniform sample of both spent
    38 of 48 served list entries on the example's list (RULER's common words, 8K), whose
    ranking is not the one asked for, and the real list's ten were too few to rank. The
    question repeated word for word is what marks an example (or the question stated before
    and after the document: the material is then what lies between)."""
    text = plan.drafter.text
    if plan.content is not None and not plan.content.empty:
        cb, ce = plan.drafter.char_span(plan.content)
    else:
        cb, ce = 0, len(text)
    key = question.sentence
    last = text.rfind(key, cb, ce) if key else -1
    earlier = text.rfind(key, cb, last) if last > cb else -1
    if earlier < 0:
        return 0
    line_end = text.find("\n", earlier + len(key), last)
    begin = line_end + 1 if line_end >= 0 else earlier + len(key)
    return plan.drafter.token_at_or_after(begin)


def proportional_order(texts: Sequence[str], sizes: Sequence[int], top: int) -> np.ndarray:
    """int64 [m]: an order of the units `texts` (token sizes `sizes`) whose every prefix keeps
    the document's proportions of its most frequent words.

    Why: an even sample of a Zipf-like text keeps each word's share only on average; at keep
    0.1 the third and fourth most frequent words (1/3 and 1/4 of the first's count) swap
    ranks in about one sample in five, and "the 3 most frequent words" is then answered
    wrong from the served prompt alone. Greedy balanced sampling: the tracked words are the
    `TRACKED_PER_ASKED` x `top` most frequent (the asked ones and those that could displace
    them; a frame word nearly every unit holds is not one, as in `frequent_units`); each
    step adds the unit after which the sample's counts s_w are closest to r x D_w (D_w the
    document's count, r the sample's share of the tokens), by sum (s_w - r D_w)^2 / D_w. The
    first `GREEDY_SHARE` of the units are so chosen (more than any keep ratio the selector
    is given asks for); the rest follow in the even bit-reversal order. Each step is one
    matrix-vector product over the units: O(m x tracked) per step.
    """
    m = len(texts)
    counts, _, frame = _unit_words(texts)
    total = Counter()
    for c in counts:
        total.update(c)
    tracked = [w for w, _ in total.most_common() if w not in frame][: TRACKED_PER_ASKED * top]
    even = np.argsort(bit_reversal_rank(m), kind="stable")
    if not tracked or m == 0:
        return even
    # the units in the even order, so that of equally good units the spread-out one is taken
    c = np.asarray([[counts[i].get(w, 0) for w in tracked] for i in even], dtype=np.float64)
    d = c.sum(axis=0)
    size = np.asarray(sizes, dtype=np.float64)[even]
    share = size / max(1.0, float(size.sum()))
    # loss after adding u, up to a constant: sum((e + c_u - share_u d)^2 / d), e = s - r d
    cc = (c * c / d).sum(axis=1)
    cd = c.sum(axis=1)
    dd = float(d.sum())
    e = np.zeros_like(d)
    chosen = np.zeros(m, dtype=bool)
    order: list[int] = []
    for _ in range(min(m, max(1, int(np.ceil(GREEDY_SHARE * m))))):
        loss = 2 * (c @ (e / d)) - 2 * share * e.sum() + cc - 2 * share * cd + share**2 * dd
        loss[chosen] = np.inf
        u = int(np.argmin(loss))  # the first of equals in the even order
        chosen[u] = True
        order.append(u)
        e = e + c[u] - share[u] * d
    order += [u for u in range(m) if not chosen[u]]
    return even[np.asarray(order, dtype=np.int64)]


def frequent_units(texts: Sequence[str]) -> np.ndarray:
    """bool [len(texts)]: the units holding a frequent word, one found in at least T of the
    units, T = max(`MIN_FREQUENT`, twice the median over the distinct words of how many
    units hold each). Why: for "which words appear most often" a word found in few units
    cannot be the answer, while a sample of the whole document keeps ~2 occurrences of each
    asked word at keep 0.1 and makes rare words look as frequent; sampling the units with a
    frequent word first keeps more of each asked word in the same budget, in proportion.
    A word held by `STRUCTURAL_SHARE` of the units or more (the "Keyword log entry:" of
    every log line) is the units' frame, not an item, and is not counted. Linear: one pass
    over the words."""
    counts, df, frame = _unit_words(texts)
    items = {w: k for w, k in df.items() if w not in frame}
    if not items:
        return np.zeros(len(texts), dtype=bool)
    t = max(MIN_FREQUENT, 2 * statistics.median(items.values()))
    return np.asarray([any(items.get(w, 0) >= t for w in c) for c in counts], dtype=bool)


def _unit_words(texts: Sequence[str]) -> tuple[list[Counter], Counter, set[str]]:
    """Each unit's word counts, how many units hold each word, and the units' frame: the
    words held by `STRUCTURAL_SHARE` of the units or more (the "Keyword log entry:" of every
    log line), which are the units' form, not what a question counts. A list item's number
    ("17." of "17. goose") is its place, not a word of it: unique to each item, the numbers
    made the median word one held by a single unit, and every word of the list frequent."""
    counts = [Counter(_WORD.findall(_LEADING_MARK.sub("", t, count=1).lower())) for t in texts]
    df = Counter(w for c in counts for w in c)
    frame = {w for w, k in df.items() if k >= STRUCTURAL_SHARE * len(texts)}
    return counts, df, frame


def _repeated_phrase(unit: AnchoredUnit) -> bool:
    """A direct anchor in lexical evidence's lowest tier: a phrase (or quote) of the
    question that many units repeat, scored `PHRASE_SCORE` per phrase word (§4.2 step 4)."""
    return unit.named and unit.hop == 0 and unit.score <= PHRASE_SCORE * (MAX_NGRAM + 1)


def stratified_candidates(
    plan: Plan,
    *,
    pinned: Sequence[Span],
    suffix_candidates: bool,
    keep: Sequence[Span] = (),
    focus: Sequence[Span] = (),
    frequent_top: int | None = None,
    material_begin: int = 0,
) -> Candidates:
    """Candidates tiling the drafter tokens at the prompt's units, ranked so that every
    prefix of the ranking is an evenly spread sample of the optional units.

    - Cuts: each unit's first token (`document_units` of the drafter text), the query
      window's and the pins' edges (a unit that holds a pin is cut there, so the pin costs
      its own tokens), and the edges of `keep` (the question sentences, which the pipeline
      promotes) and of `focus`.
    - Mandatory: as `build_candidates` (query window, pins, the structural suffix).
    - Score of optional unit i of m: 1 + (m - rank_i) / m, where rank is the unit's
      position in the bit-reversal order of 0..m-1 (0, m/2, m/4, 3m/4, ...); units inside
      `focus` are ranked among themselves and score 1 more, so they are sampled first. Any
      budget the strict selector fills by rank therefore keeps about every k-th unit, for
      the k it allows. With `frequent_top` (a question for the N most frequent items), the
      units holding a frequent word (`frequent_units`, found within `focus` and within the
      rest) come first in each, ordered by `proportional_order` instead.
    - The optional units that end at or before `material_begin` (a worked example before
      the material, `material_start`) score below every other unit (0 to 1, evenly), and
      take no part in finding the frequent words: they are sampled only when the rest is.
    """
    drafter = plan.drafter
    n = len(drafter)
    cuts = {0, n, plan.query.begin, plan.query.end, material_begin}
    cuts.update(drafter.token_span(b, e).begin for b, e in document_units(drafter.text))
    for s in (*pinned, *keep, *focus):
        cuts.update((s.begin, s.end))
    edges = np.asarray(sorted(c for c in cuts if 0 <= c <= n), dtype=np.int64)
    begin, end = edges[:-1], edges[1:]
    cands = build_candidates(
        (begin, end),
        np.zeros(n, dtype=np.float32),
        query=plan.query,
        pinned=pinned,
        suffix_candidates=suffix_candidates,
        kind="sum",
    )
    inside = np.zeros(len(cands), dtype=bool)
    for s in focus:
        inside |= (begin >= s.begin) & (end <= s.end)
    example = ~cands.mandatory & (end <= material_begin)
    optional = ~cands.mandatory & ~example
    tiers = [(optional & inside, 2.0), (optional & ~inside, 1.0)]

    def text(i: int) -> str:
        return drafter.text[slice(*drafter.char_span(Span(int(begin[i]), int(end[i]))))]

    if frequent_top is not None:
        frequent = np.zeros(len(cands), dtype=bool)
        for group in (optional & inside, optional & ~inside):
            idx = np.flatnonzero(group)
            frequent[idx] = frequent_units([text(i) for i in idx])
        tiers = [
            (optional & inside & frequent, 4.0),
            (optional & inside & ~frequent, 3.0),
            (optional & ~inside & frequent, 2.0),
            (optional & ~inside & ~frequent, 1.0),
        ]
    tiers.append((example, 0.0))
    score = np.zeros(len(cands), dtype=np.float64)
    for t, (group, lift) in enumerate(tiers):
        idx = np.flatnonzero(group)
        m = int(idx.size)
        rank = bit_reversal_rank(m)
        if frequent_top is not None and t in (0, 2) and m:  # the frequent units' tiers
            order = proportional_order([text(i) for i in idx], end[idx] - begin[idx], frequent_top)
            rank = np.empty(m, dtype=np.int64)
            rank[order] = np.arange(m, dtype=np.int64)
        score[idx] = lift + (m - rank) / max(1, m)
    return cands.replace(score=score)


def document_units(text: str) -> list[tuple[int, int]]:
    """Character ranges of the units a uniform sample draws from: each line, and a line
    longer than `LONG_LINE` chars (a paragraph of prose) cut into its sentences
    (`lexical.split_units`). Why lines first: `split_units` also cuts "12. word" after
    "12.", and a sample of half list items would keep numbers without their words; for the
    same reason a long line that is a numbered list ("1. goose 2. lifetime 3. goose ...",
    a list flattened to one line) is cut before each number (`_list_items`)."""
    out: list[tuple[int, int]] = []
    begin, n = 0, len(text)
    while begin < n:
        end = text.find("\n", begin)
        end = n if end < 0 else end
        if end - begin > LONG_LINE:
            out.extend(_list_items(text, split_units(text, begin, end)))
        elif text[begin:end].strip():
            out.append((begin, end))
        begin = end + 1
    return out


_LEADING_MARK = re.compile(r"^\s*\d{1,6}[.)]\s")
_LIST_MARK = re.compile(r"(?:^|(?<=\s))\d{1,6}[.)]$")


def _list_items(text: str, units: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """`units` of one line with each closing list marker ("2." of "goose 2.") moved to the
    start of the next unit, so that a unit is a whole item ("2. lifetime")."""
    out: list[tuple[int, int]] = []
    carry: int | None = None
    for k, (b, e) in enumerate(units):
        if carry is not None:
            b, carry = carry, None
        m = _LIST_MARK.search(text[b:e])
        if m is None or k == len(units) - 1:
            out.append((b, e))
            continue
        carry = b + m.start()
        cut = carry
        while cut > b and text[cut - 1].isspace():
            cut -= 1
        if cut > b:
            out.append((b, cut))
    return out


def bit_reversal_rank(m: int) -> np.ndarray:
    """int64 [m]: the rank of each of 0..m-1 in the bit-reversal (van der Corput) order of
    0..M-1 (M the next power of two >= m), restricted to those < m. Any prefix of that
    order is spread evenly over 0..m-1: the first 2^j are every (M / 2^j)-th index."""
    if m <= 0:
        return np.zeros(0, dtype=np.int64)
    bits = max(1, (m - 1).bit_length())
    idx = np.arange(1 << bits, dtype=np.int64)
    rev = np.zeros_like(idx)
    for b in range(bits):
        rev |= ((idx >> b) & 1) << (bits - 1 - b)
    order = rev[rev < m]  # positions in visiting order
    rank = np.empty(m, dtype=np.int64)
    rank[order] = np.arange(m, dtype=np.int64)
    return rank
