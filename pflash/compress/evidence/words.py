"""The words and units of the drafter text: what the lexical rules read (`lexical`,
`anchors`), and what the other evidence shares with them (passage evidence cuts its passages
at these units, the aggregate and framing rules and the views ask which sentences ask).

Why words: this works on **words of the drafter text**, not BPE tokens: BPE splits " magic"
and "magic", "entries" and "entry" differently, words do not, and the result is the same for
every tokenizer. Units are character ranges of the drafter text; the rules that keep them
turn them into **drafter tokens** (`Plan.drafter`).

- Units: the text cut at newlines and sentence ends (long lines in pieces of at most
  `MAX_UNIT_CHARS`): `split_units`, `cut_long`. A unit is what gets anchored and kept.
  `UnitPrefix` holds the units of the text before the latest user content for the
  conversation's next turn (`units_before`).
- Words: letters, digits and underscore (`words`), in a normalized form (`normalize`);
  `STOPWORDS` are never an anchor on their own; `names_something` and `key_words` tell a word
  that names something (a key) from one that says something; `context_words` gives each
  unit's words outside the query pool and the pinned spans.
- Sentences: one that asks (`is_question_like`) and one that says how to answer
  (`answers_form`).

Pure: `re` and the standard library.
"""

from __future__ import annotations

import bisect
import dataclasses
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from pflash.compress.text.sentences import breaks_sentence, sentence_ends

MAX_UNIT_CHARS = 400  # a longer line (minified text, a table row) is anchored in pieces

STOPWORDS = frozenset(
    """
    a about above after again against all also am an and any are as at be because been
    before being below between both but by can could did do does doing down during each
    few for from further had has have having he her here hers herself him himself his how
    i if in into is it its itself just me more most my myself no nor not now of off on
    once only or other our ours ourselves out over own same she should so some such than
    that the their theirs them themselves then there these they this those through to too
    under until up very was we were what when where which while who whom whose why will
    with would you your yours yourself yourselves shall may might must let us one ones
    please tell give find list show answer question questions explain describe summarize
    summarise return write according based given following mentioned provided context
    document documents passage text article above below say says said mean means
    user assistant system developer tool im_start im_end endoftext
    sure really okay ok thanks thank yes yeah hi hello again still actually certain
    """.split()  # the last line: a follow-up's discourse words ("Are you sure?") ask nothing
)

# Openers that make a sentence a question without a "?". Not "when", "where", "if", "is":
# they open subordinate clauses and statements in prose just as often; not "return": every
# pasted docstring opens with it.
QUESTION_OPENERS = frozenset(
    """
    what which who whom whose why how list name find give answer explain summarize
    summarise describe identify tell compare count extract determine provide write
    """.split()
)

_WORD = re.compile(r"\w+")
_LINE = re.compile(r"[^\n]+")


class Word(NamedTuple):
    """One word of the text: characters [begin, end), its normalized form, and whether it
    is a stopword (never an anchor on its own). A tuple: a long prompt has ~10^5 words."""

    begin: int
    end: int
    norm: str
    stop: bool


def normalize(word: str) -> str:
    """Lower case with a light plural strip, so "Entries" ~ "entry", "numbers" ~ "number".

    Deliberately crude (no stemmer): "-ies" -> "-y" and a final "s" dropped unless the word
    ends in "ss", "us" or "is"; short words and digits are left alone.
    """
    w = word.lower()
    if len(w) > 4 and w.endswith("ies"):
        return w[:-3] + "y"
    if len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is")) and w.isalpha():
        return w[:-1]
    return w


def words(text: str, begin: int = 0, end: int | None = None) -> list[Word]:
    """The words (letters, digits, underscore; unicode-aware) of text[begin:end], in order,
    with character offsets into `text`."""
    return [
        Word(m.start(), m.end(), *_classify(m.group()))
        for m in _WORD.finditer(text, begin, len(text) if end is None else end)
    ]


@lru_cache(maxsize=1 << 16)
def _classify(raw: str) -> tuple[str, bool]:
    """(normalized form, is a stopword); cached: a prompt repeats its vocabulary."""
    return normalize(raw), raw.lower() in STOPWORDS


def names_something(raw: str, *, opens_sentence: bool) -> bool:
    """Whether a word as written names something (a key) rather than says something: it
    holds a digit or an underscore, a capital after its first letter, or a capital where no
    sentence opens ("Zeinka", "ABCDE", "12345", "get_data", but not "sites" or "When")."""
    if "_" in raw or any(c.isdigit() for c in raw) or any(c.isupper() for c in raw[1:]):
        return True
    return raw[:1].isupper() and not opens_sentence


def key_words(text: str, ranges: Iterable[tuple[int, int]]) -> set[str]:
    """Normalized forms of the words of `text[b:e]` (each range) that name something
    (`names_something`); a word opens a sentence at its range's start or after `.?!:;` or a
    newline."""
    out: set[str] = set()
    for b, e in ranges:
        prev = b
        for i, w in enumerate(words(text, b, e)):
            opens = i == 0 or breaks_sentence(text, prev, w.begin)
            if names_something(text[w.begin : w.end], opens_sentence=opens):
                out.add(w.norm)
            prev = w.end
    return out


def split_units(
    text: str, begin: int = 0, end: int | None = None, *, max_chars: int | None = MAX_UNIT_CHARS
) -> list[tuple[int, int]]:
    """Character ranges of the units of text[begin:end]: lines cut at sentence ends,
    stripped of surrounding whitespace, pieces longer than `max_chars` cut at a space (None:
    whole sentences); ranges holding no word are dropped. Sorted and disjoint."""
    stop = len(text) if end is None else end
    out: list[tuple[int, int]] = []
    for line in _LINE.finditer(text, begin, stop):
        cut = line.start()
        for e in [*sentence_ends(text, line.start(), line.end()), line.end()]:
            out.extend(_pieces(text, cut, e, max_chars))
            cut = e
    return out


def cut_long(
    text: str, sentences: Iterable[tuple[int, int]], max_chars: int = MAX_UNIT_CHARS
) -> list[tuple[int, int]]:
    """`split_units(max_chars=None)` sentences cut into the units `split_units` gives."""
    return [p for b, e in sentences for p in _pieces(text, b, e, max_chars)]


def _unit_words(text: str, begin: int, end: int) -> list[tuple[str, bool]]:
    return [_classify(w) for w in _WORD.findall(text, begin, end)]


@dataclass(frozen=True)
class UnitPrefix:
    """`split_units(text, 0, len(self.text))` of one prompt, with each unit's words (none
    excluded), their sets and the counts over them, kept for the conversation's next turn.

    Why: every turn of a conversation anchors its question against the whole context, and
    cutting and reading the units of a long context again would cost each later question
    step, ahead of the answer, for text that had not changed since the turn before. Units are
    local to a line, so the units of an unchanged prefix are the same up to the start of
    its last line (which may go on now); `units_before` cuts only the rest. Frozen, and the
    sets are frozensets: a prefix is shared by the turns that extend it."""

    text: str
    units: tuple[tuple[int, int], ...]
    words: tuple[tuple[tuple[str, bool], ...], ...]
    sets: tuple[frozenset[str], ...]
    non_empty: int
    unit_df: Counter = dataclasses.field(repr=False)
    occurrences: Counter = dataclasses.field(repr=False)
    # units taken from the earlier turn's prefix (stats: lexical_units_reused)
    reused: int = dataclasses.field(default=0, compare=False)

    def counts(self) -> tuple[int, Counter, Counter]:
        """Copies of the counts, for a caller to mend."""
        return self.non_empty, self.unit_df.copy(), self.occurrences.copy()


def units_before(text: str, end: int, previous: UnitPrefix | None = None) -> UnitPrefix:
    """The `UnitPrefix` of `text[:end]`, reusing `previous` where `text` still starts with
    its text: the same units as `split_units(text, 0, end)` either way (a unit test)."""
    keep = 0
    if previous is not None and len(previous.text) <= end and text.startswith(previous.text):
        resume = previous.text.rfind("\n") + 1  # its last line may go on in `text`
        keep = bisect.bisect_left(previous.units, (resume, -1))
    else:
        previous, resume = None, 0
    fresh = split_units(text, resume, end)
    words = [_unit_words(text, b, e) for b, e in fresh]
    sets = [frozenset(n for n, _ in ws) for ws in words]
    if previous is None:
        non_empty, unit_df, occurrences = 0, Counter(), Counter()
    else:
        non_empty, unit_df, occurrences = previous.counts()
        for u in range(keep, len(previous.units)):  # the units of its last line go
            non_empty -= bool(previous.sets[u])
            unit_df.subtract(previous.sets[u])
            occurrences.subtract(n for n, _ in previous.words[u])
    for ws, st in zip(words, sets, strict=True):
        non_empty += bool(st)
        unit_df.update(st)
        occurrences.update(n for n, _ in ws)
    return UnitPrefix(
        text=text[:end],
        units=(*(previous.units[:keep] if previous else ()), *fresh),
        words=(*(previous.words[:keep] if previous else ()), *map(tuple, words)),
        sets=(*(previous.sets[:keep] if previous else ()), *sets),
        non_empty=non_empty,
        unit_df=unit_df,
        occurrences=occurrences,
        reused=keep,
    )


def _pieces(text: str, begin: int, end: int, max_chars: int | None) -> Iterable[tuple[int, int]]:
    while begin < end and text[begin].isspace():
        begin += 1
    while end > begin and text[end - 1].isspace():
        end -= 1
    while max_chars is not None and end - begin > max_chars:
        space = text.rfind(" ", begin + max_chars // 2, begin + max_chars)
        cut = space if space > begin else begin + max_chars
        if _WORD.search(text, begin, cut):
            yield begin, cut
        begin = cut
        while begin < end and text[begin].isspace():
            begin += 1
    if end > begin and _WORD.search(text, begin, end):
        yield begin, end


FORM_VERBS = frozenset({"answer", "reply", "respond"})


def answers_form(sentence: str) -> bool:
    """A sentence that says how to answer, not what: it opens (after an optional "please")
    with "answer", "reply" or "respond", a label "Answer:" included (a completion prompt's
    answer prefix, "Answer: The top 10 words ... are:"). "Tell me its owner." asks for more
    and is not one."""
    words = sentence.lower().split(maxsplit=2)
    if words[:1] == ["please"]:
        words = words[1:]
    return bool(words) and words[0].strip(",.:;!") in FORM_VERBS


def is_question_like(sentence: str, *, closes_turn: bool = False) -> bool:
    """A sentence that asks: it ends with "?", or it opens with a capitalized interrogative or
    imperative word ("What ...", "List ...", "Find ...") and is a whole sentence (ends with
    ".", "!" or ":", or `closes_turn`). Lower-case openers are not enough: `return x` in
    pasted code is not a question; nor is a wrapped line "What we ... the" of a document."""
    s = sentence.strip()
    if s.endswith("?"):
        return True
    m = _WORD.match(s)
    if not (m and m.group()[0].isupper() and m.group().lower() in QUESTION_OPENERS):
        return False
    return closes_turn or s.endswith((".", "!", ":"))


def context_words(
    text: str,
    units: Sequence[tuple[int, int]],
    excluded: Sequence[tuple[int, int]],
    *,
    known: Sequence[Sequence[tuple[str, bool]]] = (),
) -> list[Sequence[tuple[str, bool]]]:
    """Per unit, (normalized form, is a stopword) of each of its words outside every
    excluded range. `units` and `excluded` are sorted and disjoint, so one cursor walks the
    excluded ranges; a unit clear of them is read with one `findall`, and the pairs come
    from the `_classify` cache (nothing allocated per word). `known[i]`: unit i's words,
    none excluded (`UnitPrefix.words`), returned as they are for a unit clear of every
    excluded range (the same object: `Context` tells reused units by identity)."""
    out: list[Sequence[tuple[str, bool]]] = []
    xi = 0
    for i, (b, e) in enumerate(units):
        while xi < len(excluded) and excluded[xi][1] <= b:
            xi += 1
        if xi == len(excluded) or excluded[xi][0] >= e:
            out.append(known[i] if i < len(known) else _unit_words(text, b, e))
            continue
        kept = []
        for m in _WORD.finditer(text, b, e):
            if not any(xb <= m.start() < xe for xb, xe in excluded[xi:] if xb < e):
                kept.append(_classify(m.group()))
        out.append(kept)
    return out
