"""Questions about the whole document, and the uniform sample that answers them.

Why: a question such as "what are the 10 most common words in the list above?" or "how
many times is Paris mentioned?" is answered by the document's *proportions*, not by a few
places in it. Selection by score spends the budget on the places the question's attention
likes best, which distorts exactly those proportions (on a common-words list at keep 0.1
half of the gold top words lost their rank in the served prompt). A stratified uniform
sample of the document's units keeps relative frequencies; a count survives no sampling at
all, which is why the `auto` gate serves such prompts whole (budget.py, ALGORITHM §5.7).

Two pure parts:

- `classify_question`: the kind of aggregate question a text asks (frequency, count,
  enumerate, summary) or None. Conservative on purpose: a question only counts as
  aggregate when what it counts or lists is *in the document* ("how many times ...
  appear", "how many of the words in the list", "list all the names mentioned in the
  text"); "how many employees does Acme have?" is a fact lookup. A linear scan over words,
  no regex with backtracking over the question.
- `stratified_candidates`: candidates that tile the prompt at its units (lines, sentences,
  list items: `words.split_units`), scored so that any prefix of their ranking is an
  evenly spread sample (a bit-reversal order of the units). The strict selector, which
  fills by rank whatever the budget of the current ceiling attempt, therefore keeps every
  k-th unit at whatever k the budget allows. Deterministic: no random numbers.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from pflash.compress.evidence.anchors import MAX_NGRAM, PHRASE_SCORE
from pflash.compress.evidence.lexical import AnchoredUnit, LexicalEvidence
from pflash.compress.evidence.words import answers_form, is_question_like, split_units
from pflash.compress.plan.query import Plan
from pflash.compress.selection import Candidates, build_candidates
from pflash.spans import Span

QuestionKind = Literal["frequency", "count", "enumerate", "summary"]

EDGE_CHARS = 1000  # characters read at each edge of the user's content for its question
MAX_QUESTION_CHARS = 2000  # an explicit `pflash_query` longer than this is read in part
MAX_SENTENCES = 4  # question sentences read at the content's end
LABEL_CHARS = 20  # "Question:", "Task:": a label read past before a question
LONG_LINE = 200  # characters: a longer line is sampled by its sentences
MIN_FREQUENT = 3  # units a word must be in, at least, to count as frequent
STRUCTURAL_SHARE = 0.9  # a word nearly every unit holds ("Keyword log entry:") tells none apart
LEAST = frozenset("least fewest rarest rarely less".split())
DEFAULT_TOP = 10  # items a "most frequent words" question asks for when it names no number
TRACKED_PER_ASKED = 2  # words whose proportions the sample keeps: twice the number asked
GREEDY_SHARE = 0.4  # the share of a tier's units ordered by `proportional_order`
NUMBER_WORDS = {
    w: i
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
        " fifteen sixteen seventeen eighteen nineteen twenty".split()
    )
}

_WORD = re.compile(r"[a-z0-9]+")
_SENTENCE = re.compile(r"[^.?!;\n]+")

# the document itself, as a question names it ("in the text", "of the list above")
DOC_NOUNS = frozenset(
    """
    text texts list lists document documents doc passage passages article log logs file
    files context paragraph paragraphs story essay transcript excerpt input lines entries
    snippet sequence page pages conversation chat book chapter report records table data
    dataset corpus message messages email lyrics poem sentences content
    """.split()
)
# words that may stand between "in" and the document noun ("in the above list")
DOC_MODIFIERS = frozenset(
    """
    the this that these those above below following given provided entire whole full
    previous preceding attached same original
    """.split()
)
# a word occurs in the document: what a count or a frequency question is about
OCCURS = frozenset(
    """
    appear appears appeared appearing appearance appearances occur occurs occurred
    occurring occurrence occurrences mentioned mention mentions listed repeated repeats
    repetitions written cited referenced
    """.split()
)
# the items of a text that a frequency question ranks without naming the document
TEXT_ITEMS = frozenset("word words term terms keyword keywords token tokens".split())
# items it ranks when it names the document too ("most common names in the list")
ITEMS = TEXT_ITEMS | frozenset(
    """
    name names phrase phrases letter letters character characters number numbers value
    values entry entries item items tag tags label labels element elements color colors
    colour colours city cities country countries animal animals fruit fruits
    """.split()
)
# "in the text" after one of these points at where a fact is stated, not at what is counted
STATED = frozenset("described according stated reported based given as".split())
AUX = frozenset("are is were was do does did have has had can could will would should".split())
WHOLE = frozenset("whole entire overall full complete".split())
SUMMARY_CUES = frozenset("summarize summarise summary overview recap gist tldr synopsis".split())
GIST_NOUNS = frozenset("points ideas idea themes theme takeaways topics topic".split())
ENUM_VERBS = frozenset(
    "list name enumerate extract identify give find collect output print write show".split()
)
# a qualifier between "all" and the document: the list is filtered by a key, a retrieval
# ("all the special magic numbers for X mentioned in the text")
QUALIFIERS = frozenset("for of about with associated related to regarding concerning".split())
# after the document noun: a part of it is meant ("summarize the paragraph about taxes")
SCOPED = frozenset("about on regarding concerning related that which where".split())


@dataclass(frozen=True)
class AggregateQuestion:
    """An aggregate question: its `kind` and the question sentence that asked it (as
    written, at most `MAX_QUESTION_CHARS`)."""

    kind: QuestionKind
    sentence: str


# ----------------------------------------------------------------------------- detector


def classify_question(text: str) -> AggregateQuestion | None:
    """The aggregate kind of the first sentence of `text` that asks one, else None.

    Kinds, tried in this order on each sentence (words lower-cased):
    - frequency: "most/least common|frequent|often" ranking items (words, or names,
      numbers ... of the document), an occurrence verb with "most|more|least" ("appears
      most often"), "top N words", "by frequency";
    - count: "how many times", "how often", "number of times|occurrences", "count ..." with
      an occurrence verb or the document named; "how many" when the counted thing is in
      the document ("how many words are in the list", "how many people are mentioned");
    - enumerate: "list|name|give ... all|every|each ..." of something mentioned, listed or
      in the document, without a qualifier that filters by a key ("... for X");
    - summary: "summarize|summary|overview ..." of the whole document ("the text", "this",
      "the above", "overall"), "the main points of the article", "what is this text about".
    """
    for sentence in _SENTENCE.findall(text[:MAX_QUESTION_CHARS]):
        ws = _WORD.findall(sentence.lower())
        if not ws:
            continue
        for kind, rule in _RULES:
            if rule(ws):
                return AggregateQuestion(kind, sentence.strip())
    return None


def _doc_scope(ws: Sequence[str], begin: int, end: int) -> bool:
    """Whether ws[begin:end] says the thing asked about is in the document: an occurrence
    verb ("mentioned", "appears"), "in|from|within|throughout the (above) <document>" not
    after a word of statement ("described in the text"), or "above|below" closing the
    sentence or before a document noun."""
    for k in range(begin, min(end, len(ws))):
        w = ws[k]
        if w in OCCURS:
            return True
        if w in ("in", "from", "within", "throughout", "across") and (
            k == 0 or ws[k - 1] not in STATED
        ):
            j = k + 1
            while j < len(ws) and j <= k + 3 and ws[j] in DOC_MODIFIERS:
                j += 1
            if j < len(ws) and ws[j] in DOC_NOUNS:
                return True
            if j == len(ws) and ws[j - 1] in ("above", "below"):
                return True
        if w in ("above", "below") and (k == len(ws) - 1 or ws[k + 1] in DOC_NOUNS):
            return True
    return False


def _frequency(ws: Sequence[str]) -> bool:
    n = len(ws)
    for k, w in enumerate(ws):
        if w in ("most", "least", "more"):
            nxt = ws[k + 1] if k + 1 < n else ""
            if nxt in ("common", "commonly", "frequent", "frequently", "often", "repeated"):
                after = ws[k + 2 : k + 5]
                if after[:1] and after[0] in OCCURS:  # "most frequently mentioned city"
                    return True
                if any(a in TEXT_ITEMS for a in after):  # "most common words"
                    return True
                if any(a in ITEMS for a in after) and _doc_scope(ws, k, n):
                    return True
            if any(p in OCCURS for p in ws[max(0, k - 3) : k]):  # "appears most often"
                return True
        elif w == "top" and any(a in TEXT_ITEMS for a in ws[k + 1 : k + 4]):
            return True  # "the top 10 words"
        elif w in ("frequency", "frequencies"):
            before = ws[k - 1] if k else ""
            if before in ("word", "term", "by") or (
                before == "of" and k >= 2 and ws[k - 2] == "order"
            ):
                return True
            if _doc_scope(ws, k, n) and before not in ("the", "a"):
                return True
    return False


def _count(ws: Sequence[str]) -> bool:
    n = len(ws)
    for k, w in enumerate(ws):
        nxt = ws[k + 1] if k + 1 < n else ""
        if (w == "how" and nxt == "often") or (
            w in ("how", "number")
            and nxt in ("many", "of")
            and k + 2 < n
            and ws[k + 2] in ("times", "occurrences")
        ):
            return _doc_scope(ws, k, n)
        if w == "how" and nxt == "many" and _counted_in_document(ws, k + 2):
            return True
        if w == "number" and nxt == "of" and _doc_scope(ws, k + 2, n):
            return True  # "the number of words in the list"
        if w == "count" and (k == 0 or ws[k - 1] in ("please", "you", "now", "and")):
            return _doc_scope(ws, k + 1, n)  # "count the words in the list"
    return False


def _counted_in_document(ws: Sequence[str], start: int) -> bool:
    """After "how many": the noun phrase (at most 6 words), then what the sentence says of
    it. In the document when an occurrence verb follows it ("people are mentioned"), a
    document phrase ("words in the list", "words are there in the text"), or "does the
    <document> contain|list|include|mention"."""
    n = len(ws)
    k = start
    while k < n and k < start + 6 and ws[k] not in AUX and ws[k] not in OCCURS:
        if ws[k] in ("in", "within", "from") and _doc_scope(ws, k, k + 1):
            return True
        k += 1
    if k >= n:
        return False
    if ws[k] in OCCURS:
        return True
    if ws[k] not in AUX:
        return False
    rest = ws[k + 1 : k + 4]
    if rest[:1] and rest[0] in OCCURS:
        return True
    if rest[:1] == ["there"] or (rest[:1] and rest[0] in ("in", "within")):
        return _doc_scope(ws, k + 1, k + 6)
    if ws[k] in ("do", "does", "did") and len(rest) >= 2:
        j = 0
        while j < len(rest) and rest[j] in DOC_MODIFIERS:
            j += 1
        if j < len(rest) and rest[j] in DOC_NOUNS:
            verb = ws[k + 2 + j] if k + 2 + j < n else ""
            return verb in ("contain", "list", "include", "mention", "have", "hold")
    return False


def _enumerate(ws: Sequence[str]) -> bool:
    n = len(ws)
    for k, w in enumerate(ws):
        if w not in ("all", "every", "each"):
            continue
        before = ws[max(0, k - 3) : k]
        if not (any(b in ENUM_VERBS for b in before) or before[-2:] in (["what", "are"],)):
            continue
        end = k + 1
        while end < n and end <= k + 8 and not _doc_scope(ws, end, end + 1):
            if ws[end] in QUALIFIERS:
                return False
            end += 1
        return end < n and end <= k + 8
    return False


def _summary(ws: Sequence[str]) -> bool:
    n = len(ws)
    for k, w in enumerate(ws):
        if w in SUMMARY_CUES or (
            w in GIST_NOUNS and k and ws[k - 1] in ("main", "key", "central", "major")
        ):
            if any(x in WHOLE for x in ws):
                return True
            j = k + 1
            while j < n and j <= k + 5 and ws[j] in DOC_MODIFIERS | {"of", "me", "a", "an", "up"}:
                j += 1
            if j == n and ws[j - 1] in ("this", "above", "it") or (j < n and ws[j] == "everything"):
                return True
            if j < n and ws[j] in DOC_NOUNS:
                return j + 1 == n or ws[j + 1] not in SCOPED
        if w == "what" and n - k == 5 and ws[k + 1] == "is" and ws[k + 4] == "about":
            if ws[k + 2] in ("this", "the") and ws[k + 3] in DOC_NOUNS:  # "what is this text about"
                return True
    return False


_RULES = (
    ("frequency", _frequency),
    ("count", _count),
    ("enumerate", _enumerate),
    ("summary", _summary),
)


# ----------------------------------------------------------------------------- the question


def asked_text(plan: Plan, pflash_query: str | None = None) -> str:
    """The text whose question decides the kind: `pflash_query` when the client sent one,
    else the asking sentences at the edges of the latest user content - its first sentence
    when it asks (`words.is_question_like`), and its last one with the "?" sentences just
    before it; a closing answer prefix (`words.answers_form`: "Answer: The top 10 words
    that appear most often in the list are:", which a completion-style prompt ends with)
    is read past, not taken for the end of the question. Only `EDGE_CHARS` at each edge are read: a question sits before or after
    what was pasted, and a pasted document's own sentences ask nothing of it."""
    if pflash_query:
        return pflash_query[:MAX_QUESTION_CHARS]
    text = plan.drafter.text
    if plan.content is not None and not plan.content.empty:
        cb, ce = plan.drafter.char_span(plan.content)
    else:
        cb, ce = 0, len(text)
    asked: list[str] = []
    tail = split_units(text, max(cb, ce - EDGE_CHARS), ce, max_chars=None)
    if tail and ce - EDGE_CHARS > cb:
        tail = tail[1:]  # the first may be a cut sentence
    closing = [text[b:e] for b, e in reversed(tail)]
    while closing and answers_form(closing[0]) and not closing[0].rstrip().endswith("?"):
        closing = closing[1:]  # an answer prefix ("Answer: The top 10 words ... are:")
    for i, raw in enumerate(closing[:MAX_SENTENCES]):
        sentence = _unlabelled(raw)
        if i == 0 and not is_question_like(sentence, closes_turn=True):
            break
        if i > 0 and not sentence.rstrip().endswith("?"):
            break
        asked.append(sentence)
    head = split_units(text, cb, min(ce, cb + EDGE_CHARS), max_chars=None)
    if head and (len(head) > 1 or cb + EDGE_CHARS >= ce):
        first = _unlabelled(text[head[0][0] : head[0][1]])
        if is_question_like(first) and first not in asked:
            asked.append(first)
    return "\n".join(asked)


def _unlabelled(sentence: str) -> str:
    """The sentence without a short label before a colon ("Question: List the ten ...",
    "Q: ..."), so that an imperative question is recognised by its first word."""
    colon = sentence.find(":", 0, LABEL_CHARS + 1)
    label = sentence[:colon].strip()
    if colon > 0 and label.replace(" ", "").isalpha():
        return sentence[colon + 1 :].strip()
    return sentence


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


def asks_most_frequent(question: AggregateQuestion) -> bool:
    """A frequency question for the most frequent items ("the 10 most common words"), not
    the least ("which word appears least often": its answer is in the rare units)."""
    return question.kind == "frequency" and not LEAST.intersection(
        _WORD.findall(question.sentence.lower())
    )


def asked_top(question: AggregateQuestion) -> int:
    """How many top items a frequency question asks for: the number (digits or a word up to
    twenty) right before "most" or right after "top" ("the 3 most frequent", "the ten most
    common", "top 5 words"); `DEFAULT_TOP` when it names none."""
    ws = _WORD.findall(question.sentence.lower())
    for k, w in enumerate(ws):
        near = (
            ws[k - 1] if w == "most" and k else ws[k + 1] if w == "top" and k + 1 < len(ws) else ""
        )
        n = int(near) if near.isdigit() and len(near) <= 4 else NUMBER_WORDS.get(near, 0)
        if n > 0:
            return n
    return DEFAULT_TOP


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
    (`words.split_units`). Why lines first: `split_units` also cuts "12. word" after
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
