"""Questions about the whole document: whether a prompt asks one, and what it asks for.

Why: a question such as "what are the 10 most common words in the list above?" or "how
many times is Paris mentioned?" is answered by the document's *proportions*, not by a few
places in it. Selection by score spends the budget on the places the question's attention
likes best, which distorts exactly those proportions (on a common-words list at keep 0.1
half of the gold top words lost their rank in the served prompt). A stratified uniform
sample of the document's units keeps relative frequencies (`stratified.py`); a count
survives no sampling at all, which is why the `auto` gate serves such prompts whole
(budget.py, ALGORITHM §5.7).

Pure, over the question's text:

- `classify_question`: the kind of aggregate question a text asks (frequency, count,
  enumerate, summary) or None. Conservative on purpose: a question only counts as
  aggregate when what it counts or lists is *in the document* ("how many times ...
  appear", "how many of the words in the list", "list all the names mentioned in the
  text"); "how many employees does Acme have?" is a fact lookup. A linear scan over words,
  no regex with backtracking over the question.
- `asked_text`: the text whose question `classify_question` reads; `asks_most_frequent`
  and `asked_top`: what a frequency question ranks, which the sample keeps in proportion.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pflash.compress.evidence.words import answers_form, is_question_like, split_units
from pflash.compress.plan.query import Plan

QuestionKind = Literal["frequency", "count", "enumerate", "summary"]

EDGE_CHARS = 1000  # characters read at each edge of the user's content for its question
MAX_QUESTION_CHARS = 2000  # an explicit `pflash_query` longer than this is read in part
MAX_SENTENCES = 4  # question sentences read at the content's end
LABEL_CHARS = 20  # "Question:", "Task:": a label read past before a question
LEAST = frozenset("least fewest rarest rarely less".split())
DEFAULT_TOP = 10  # items a "most frequent words" question asks for when it names no number
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
            if ws[end] in QUALIFIERS or _is_key(ws[end]):
                return False
            end += 1
        return end < n and end <= k + 8
    return False


def _is_key(word: str) -> bool:
    """A word that names one thing to look up, not a kind of thing to list: a number of 3+
    digits or a code mixing letters and digits ("all variables assigned the value 62950",
    "all rows whose code is ab12 in the table"). The question retrieves what that key leads
    to."""
    has_digit = any(c.isdigit() for c in word)
    return has_digit and (len(word) >= 3 or any(c.isalpha() for c in word))


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
    when it asks (`lexical.is_question_like`), and its last one with the "?" sentences just
    before it; a closing answer prefix (`lexical.answers_form`: "Answer: The top 10 words
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
