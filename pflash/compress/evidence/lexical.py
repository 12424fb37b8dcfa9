"""Lexical evidence for strict selection: text that shares rare words with the question.

Why: a small drafter (SmolLM2-135M) ranks evidence poorly by attention alone. At a 10%
budget the needle, the several values under one key, the links of a variable chain or the
function whose docstring the user quotes are often dropped, although the question names
them. Retrieval questions repeat a rare key that also sits next to the answer (the
reference's 4-gram anchors, ALGORITHM.md §4.1 step 3); multi-hop chains are linked by rare
names that only the previous hop mentions (the transitive cascade, §4.2).

This module works on **words of the drafter text**, not BPE tokens: BPE splits " magic" and
"magic", "entries" and "entry" differently, words do not, and the result is the same for
every tokenizer. Only the output spans are in **drafter tokens** (`Plan.drafter`).

One module of ~660 lines on purpose: word extraction, the question pool, anchors, the
phrase tier and the cascade are one pipeline over the same word index; split, each part
would need the others' private word tables.

1. Units: the text cut at newlines and sentence ends (long lines in pieces of at most
   `MAX_UNIT_CHARS`). A unit is what gets anchored and kept.
2. Query pool: the questions of the latest user turn wherever they sit - at its edges, or
   set as their own paragraph inside a pasted document (mode `question`) - or its last
   `query_tokens` tokens (mode `tail`, the reference rule); plus the pinned question span
   and the explicit `pflash_query`.
3. Context: every word outside the query pool and the pinned spans.
4. Anchors: a context unit holding a rare query word, or a query word n-gram (>= 2 words,
   one of them not a stopword), that occurs in at most `ANCHOR_MAX_UNITS` units (and in at
   most `COMMON_SHARE` of them). Scored by the IDF of the distinct query words it holds plus
   a bonus for the longest shared n-gram. The question names it (`AnchoredUnit.named`) when
   it shares a key (a word that names something, in at most `rare_max_freq` units), a
   phrase of 3+ words or a quote. An indented hit also anchors its header line (the
   `def` above a docstring line), scored just below it.
   A unit that only shares a longer phrase with the question (>= 3 words, two of them
   content words) that many units repeat - the log lines a counting question is about -
   is anchored in the lowest tier: after every key, before attention; in it, units
   repeated word for word come before singletons (`_phrase_tier_scores`).
   A string the question quotes ("...", `...`, '...', “...”) is matched character for
   character (case and runs of whitespace aside, a closing ".,;:!?" optional): the units it
   sits in are keys scored above any shared n-gram, or phrase-tier units when many repeat
   it. Why: words drop the symbols that tell "Same as a *= b." from a dozen other
   "Same as a ... b." docstrings, and a user who quotes a line means that line.
5. Cascade (optional): starting from the anchors on a key (a query word or n-gram in at
   most `rare_max_freq` units; a single word only when it names something - digits, an
   underscore, a capital inside it or not opening a sentence: `key_words`), rare words of anchored units (at most `rare_max_freq`
   occurrences in the context, not query words) anchor the other units holding them, one
   hop per round, each hop scoring `HOP_DECAY` of its parent; a unit whose rare words lead
   to more than `MAX_FANOUT` new units passes nothing on (a chain, not prose); a round that
   would push the anchored tokens over `cap_tokens` is reverted and ends the cascade.

Pure: `re` and the standard library; nothing here knows about budgets beyond the cap.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, NamedTuple

from pflash.compress.plan.query import Plan
from pflash.compress.text.code_headers import block_header
from pflash.compress.text.sentences import breaks_sentence, sentence_ends
from pflash.spans import Span, TokenizedText, canonicalize

LexicalMode = Literal["anchors", "cascade"]
LexicalQuery = Literal["question", "tail"]

MAX_UNIT_CHARS = 400  # a longer line (minified text, a table row) is anchored in pieces
MAX_NGRAM = 6  # words; longer shared runs score as 6
ANCHOR_MAX_UNITS = 8  # a query word or n-gram in more units is a phrase, not a key (§4.1 max_hits)
COMMON_SHARE = 0.10  # ... and so is one in more than this share of the units
PHRASE_MIN_WORDS = 3  # a phrase of the question repeated in many units: "keyword log entry"
PHRASE_MAX_SHARE = 0.5  # ... but not in most of them (boilerplate)
PHRASE_SCORE = 1e-3  # per phrase word: phrase units rank after every key anchor and hop
REPEAT_BONUS = 0.5  # phrase units repeated word for word rank first in their tier (< 1 word)
QUOTE_SCORE = float(MAX_NGRAM)  # a quoted string outranks any shared n-gram's bonus
HOP_DECAY = 0.9  # cascade: a unit reached in hop k scores 0.9^k of its parent
MAX_FANOUT = 1  # cascade: a unit whose rare words reach more new units is no chain link
HEADER_GAP = 1e-3  # a header scores this much below its hit, so it is promoted right after

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

QUOTE_MAX_CHARS = 300  # longer "quotes" are more likely two unrelated quote marks
# quotes read per source (the question, `pflash_query`): each is one case-insensitive
# search of the whole text, up to QUOTE_MAX_CHARS steps per character; a question quotes a
# string or two, a crafted `pflash_query` could quote hundreds
MAX_QUOTES = 4

_WORD = re.compile(r"\w+")
_QUOTED = re.compile(
    rf'"([^"\n]{{3,{QUOTE_MAX_CHARS}}})"|“([^”\n]{{3,{QUOTE_MAX_CHARS}}})”'
    rf"|`([^`\n]{{3,{QUOTE_MAX_CHARS}}})`|(?<!\w)'([^'\n]{{3,{QUOTE_MAX_CHARS}}})'(?!\w)"
)
_LINE = re.compile(r"[^\n]+")


# ----------------------------------------------------------------------------- words and units


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


def quoted_patterns(text: str, ranges: Iterable[tuple[int, int]]) -> list[re.Pattern[str]]:
    """What the question quotes in `text[b:e]` (each range), as patterns that find the
    quoted string in the context: case aside, any run of whitespace for a space, a closing
    ".,;:!?" left out (the text may go on where the quote ends). A quote of stopwords alone
    ("what it is") names nothing and gives no pattern. The first `MAX_QUOTES` only."""
    out: dict[str, re.Pattern[str]] = {}
    for b, e in ranges:
        for m in _QUOTED.finditer(text, b, e):
            if len(out) >= MAX_QUOTES:
                return list(out.values())
            quote = next(g for g in m.groups() if g is not None)
            quote = quote.strip().rstrip(".,;:!?").strip()
            if len(quote) < 3 or all(w.stop for w in words(quote)):
                continue
            source = r"\s+".join(re.escape(part) for part in quote.split())
            out.setdefault(source, re.compile(source, re.IGNORECASE))
    return list(out.values())


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
    cutting and reading the units of 64K tokens took ~40-75 ms of each later question step,
    ahead of the answer, for text that had not changed since the turn before. Units are
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


# ----------------------------------------------------------------------------- evidence


@dataclass(frozen=True)
class LexicalParams:
    """Knobs of `find_lexical_evidence` (config fields `select_lexical`, `lexical_*`,
    `anchor_query_tokens`). `query_tokens` caps the query pool in drafter tokens;
    `cap_tokens` is the cascade's ceiling on anchored drafter tokens (10x the budget in the
    pipeline; None = no cap)."""

    mode: LexicalMode = "anchors"
    query: LexicalQuery = "question"
    query_tokens: int = 96
    rare_max_freq: int = 2
    cascade_iters: int = 3
    cap_tokens: int | None = None

    @classmethod
    def from_config(cls, config, *, cap_tokens: int | None) -> LexicalParams:
        return cls(
            mode=config.select_lexical,
            query=config.lexical_query,
            query_tokens=config.anchor_query_tokens,
            rare_max_freq=config.lexical_rare_max_freq,
            cascade_iters=config.lexical_cascade_iters,
            cap_tokens=cap_tokens,
        )


@dataclass(frozen=True)
class AnchoredUnit:
    """A context unit the question points at. `span`: drafter tokens. `score`: higher first
    (IDF of the shared query words + n-gram bonus, decayed per cascade hop). `hop`: 0 for a
    direct anchor, k for the k-th cascade round. `reason`: "anchor", "cascade" or "header".
    `named`: the question names this text - it shares a word that names something
    (`names_something`) and that at most `rare_max_freq` units hold, a phrase of >=
    `PHRASE_MIN_WORDS` words or a string it quotes, or a cascade or header reached from such
    text; False for a unit that only shares plain words ("month", "sites") or a name many
    units repeat ("London" in articles about pubs), which passage evidence ranks better
    (`promotion_order`)."""

    span: Span
    score: float
    hop: int
    reason: str
    named: bool = True


@dataclass(frozen=True)
class LexicalEvidence:
    """What the question shares with the context, for one prompt.

    - `units`: anchored units, best first (score desc, then source order).
    - `query_pool`: the text the query words were read from (drafter-token spans, canonical),
      including the pinned question span.
    - `question`: the pool's question-like sentences (mode `question`; empty for `tail`).
      The pipeline keeps these first: the target cannot answer a question it never sees,
      and one asked before a pasted document is not pinned.
    """

    units: tuple[AnchoredUnit, ...]
    query_pool: tuple[Span, ...]
    question: tuple[Span, ...] = ()
    prefix: UnitPrefix | None = dataclasses.field(default=None, repr=False, compare=False)

    def cut_points(self) -> tuple[int, ...]:
        """Drafter-token positions where candidates are cut, so each unit is its own."""
        spans = (*self.question, *(u.span for u in self.units))
        return tuple(sorted({p for s in spans for p in (s.begin, s.end)}))

    def promotion_order(self, *, named_only: bool = False) -> tuple[Span, ...]:
        """Spans to keep first, in order: the question, then the units best first; with
        `named_only` only the units the question names. Why: with passage evidence mixed
        in, a unit sharing only plain words with the question ("month" in every lease line
        of an aggregation prompt) is no key; kept first, seven such lines took a 2K budget's
        room for the five facts the sentence embedder ranked best. It competes by its mixed
        score instead."""
        units = (u for u in self.units if u.named or not named_only)
        return (*self.question, *(u.span for u in units))


def find_lexical_evidence(
    plan: Plan,
    *,
    pinned: Sequence[Span],
    params: LexicalParams,
    pflash_query: str | None = None,
    previous: UnitPrefix | None = None,
) -> LexicalEvidence:
    """Anchored units of one prompt (see the module docstring for the rules).

    `plan`: the prompt's plan (drafter tokens, latest user content, question span);
    `pinned`: drafter-token spans kept anyway (their words are neither query nor context);
    `pflash_query`: the explicit query text, if the client sent one;
    `previous`: the `UnitPrefix` an earlier turn of this conversation returned (in
    `LexicalEvidence.prefix`): its units are reused where this text still starts with its
    text, and the result is the same as without it.
    """
    drafter = plan.drafter
    text = drafter.text
    content = _content_chars(plan)
    # no unit straddles the content's edges (a chat marker shares the question's line)
    cb, ce = content
    sentences = split_units(text, cb, ce, max_chars=None)
    prefix = units_before(text, cb, previous)
    units = [*prefix.units, *cut_long(text, sentences), *split_units(text, ce)]
    asked = (
        _question_sentences(drafter, sentences, content, params.query_tokens)
        if params.query == "question"
        else []
    )
    pool_ranges = _query_pool(drafter, plan, content, params, asked)
    pool_spans = canonicalize(drafter.token_span(b, e) for b, e in pool_ranges)
    question = canonicalize(drafter.token_span(b, e) for b, e in asked)

    pool_seqs = [words(text, b, e) for b, e in pool_ranges]
    if pflash_query:
        pool_seqs.append(words(pflash_query))
    pool_seqs = [seq for seq in pool_seqs if seq]
    query_words = {w.norm for seq in pool_seqs for w in seq if not w.stop}
    if not query_words:
        return LexicalEvidence((), pool_spans, question, prefix)
    grams = _pool_ngrams(pool_seqs)
    keys = key_words(text, pool_ranges)
    if pflash_query:
        keys |= key_words(pflash_query, [(0, len(pflash_query))])

    excluded = _merge_ranges([*pool_ranges, *(drafter.char_span(s) for s in pinned)])
    context = _context_words(text, units, excluded, known=prefix.words)
    ctx = _Context(units, context, drafter, prefix)

    scores, strong, named = _anchor_scores(
        ctx, query_words & keys, grams, query_words, params.rare_max_freq
    )
    quotes = quoted_patterns(text, pool_ranges)
    if pflash_query:
        quotes += quoted_patterns(pflash_query, [(0, len(pflash_query))])
    _anchor_quotes(ctx, quotes, excluded, scores, strong, named, params.rare_max_freq)
    found: dict[int, tuple[float, int, str]] = {u: (s, 0, "anchor") for u, s in scores.items()}
    if params.mode == "cascade":
        _cascade(ctx, found, strong, query_words, params)
    named |= {u for u, (_, hop, _) in found.items() if hop}  # reached from a key
    out = [
        AnchoredUnit(drafter.token_span(*units[u]), s, hop, reason, u in named)
        for u, (s, hop, reason) in found.items()
    ]
    out.extend(_headers(text, units, found, named, excluded, drafter))
    out = _best_per_span(out)
    out.sort(key=lambda a: (-a.score, a.span.begin, a.span.end))
    return LexicalEvidence(tuple(out), pool_spans, question, prefix)


# ----------------------------------------------------------------------------- query pool


def _content_chars(plan: Plan) -> tuple[int, int]:
    """Characters of the latest user content; the whole text when there is none."""
    if plan.content is not None and not plan.content.empty:
        return plan.drafter.char_span(plan.content)
    return 0, len(plan.drafter.text)


def _query_pool(
    drafter: TokenizedText,
    plan: Plan,
    content: tuple[int, int],
    params: LexicalParams,
    asked: Sequence[tuple[int, int]],
) -> list[tuple[int, int]]:
    """Character ranges of the query pool, merged: the question sentences `asked` (mode
    `question`) or the last `query_tokens` tokens of the content (mode `tail`, the
    reference rule), plus the pinned question span (the explicit query, or the scorer's
    window)."""
    ranges = list(asked)
    if params.query == "tail":
        span = drafter.token_span(*content)
        tail = Span(max(span.begin, span.end - params.query_tokens), span.end)
        if not tail.empty:
            ranges.append(drafter.char_span(tail))
    if not plan.query_span.empty:
        ranges.append(drafter.char_span(plan.query_span))
    return _merge_ranges(ranges)


def _question_sentences(
    drafter: TokenizedText,
    inside: Sequence[tuple[int, int]],
    content: tuple[int, int],
    query_tokens: int,
) -> list[tuple[int, int]]:
    """Character ranges of the content's questions, in the order they join the pool.
    `inside`: the content's whole sentences (`split_units(max_chars=None)`).

    1. The question blocks at the content's edges: the edge sentence when it asks
       (`is_question_like`; the last one may omit its final "."), then the "?" sentences
       next to it in the same paragraph. A turn's question sits before or after the pasted
       text far more often than in its middle.
    2. Only when no edge block holds a "?": the "?" sentences set as their own paragraph
       anywhere ("\n\nQuestion: ...?\n\n"), nearest to an edge first: a question asked
       in the middle of the text ("answer the question given inside the document").
    Other "?" sentences are the document's own: long documents hold many, and their words
    would anchor unrelated text. The pool takes these while they fit `query_tokens`
    (`_fit_pool`); with none, the content's last sentence.
    """
    text = drafter.text
    cb, ce = content
    if not inside:
        return []
    last = inside[-1]

    def asks(r: tuple[int, int]) -> bool:
        return is_question_like(text[r[0] : r[1]], closes_turn=r == last)

    asking: list[tuple[int, int]] = []
    taken: set[tuple[int, int]] = set()
    for edge in (inside, inside[::-1]):
        for k, r in enumerate(edge):
            if k == 0 and not asks(r):
                break
            if k > 0:
                gap = text[min(r[1], edge[k - 1][1]) : max(r[0], edge[k - 1][0])]
                if not text[r[0] : r[1]].endswith("?") or "\n\n" in gap:
                    break
            if r not in taken:  # a set: a turn of thousands of "?" stays linear
                asking.append(r)
                taken.add(r)
    if any(text[b:e].endswith("?") for b, e in asking):
        return _fit_pool(drafter, asking, query_tokens)
    alone = [
        r for r in inside if text[r[0] : r[1]].endswith("?") and _own_paragraph(text, r, cb, ce)
    ]
    alone.sort(key=lambda r: min(r[0] - cb, ce - r[1]))
    asking += [r for r in alone if r not in taken]
    return _fit_pool(drafter, asking or [last], query_tokens)


def _fit_pool(
    drafter: TokenizedText, asking: Sequence[tuple[int, int]], query_tokens: int
) -> list[tuple[int, int]]:
    """The sentences that fit `query_tokens` drafter tokens, in order; a first one longer
    than that gives its last `query_tokens` tokens."""
    ranges: list[tuple[int, int]] = []
    left = query_tokens
    for b, e in asking:
        span = drafter.token_span(b, e)
        if len(span) > left:
            if ranges or left <= 0:
                continue
            # one question longer than the pool: its last tokens, as the tail rule
            span = Span(span.end - left, span.end)
            b = drafter.char_span(span)[0]
        ranges.append((b, e))
        left -= len(span)
    return ranges


def _own_paragraph(text: str, r: tuple[int, int], cb: int, ce: int) -> bool:
    """The sentence `r` is a paragraph by itself: a blank line (or the content's edge) on
    both sides."""
    before = text[max(cb, r[0] - 64) : r[0]].rstrip(" \t")
    after = text[r[1] : min(ce, r[1] + 64)].lstrip(" \t")
    return (r[0] - cb <= len(before) and not before.strip() or before.endswith("\n\n")) and (
        not after.strip() and ce - r[1] <= 64 or after.startswith("\n\n")
    )


def _pool_ngrams(pool_seqs: Sequence[Sequence[Word]]) -> set[tuple[str, ...]]:
    """Every run of 2..MAX_NGRAM consecutive normalized words inside one pool range."""
    grams: set[tuple[str, ...]] = set()
    for seq in pool_seqs:
        norms = [w.norm for w in seq]
        for i in range(len(norms)):
            for n in range(2, MAX_NGRAM + 1):
                if i + n > len(norms):
                    break
                grams.add(tuple(norms[i : i + n]))
    return grams


def _merge_ranges(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    return [(s.begin, s.end) for s in canonicalize(Span(b, e) for b, e in ranges)]


# ----------------------------------------------------------------------------- context


def _context_words(
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
    excluded range (the same object: `_Context` tells reused units by identity)."""
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


class _Context:
    """Per-unit word sets and the frequencies the rules read (built once per prompt)."""

    def __init__(
        self,
        units: Sequence[tuple[int, int]],
        context: list[Sequence[tuple[str, bool]]],
        drafter: TokenizedText,
        prefix: UnitPrefix | None = None,
    ):
        self.units = units
        self.words = context
        if prefix is None:
            self.sets: list[frozenset[str]] = [frozenset(n for n, _ in ws) for ws in context]
            non_empty = sum(1 for s in self.sets if s)
            self.unit_df = Counter(n for s in self.sets for n in s)
            self.occurrences = Counter(n for ws in context for n, _ in ws)
        else:  # the prefix's tables, mended where this prompt's exclusions differ
            k = len(prefix.units)
            self.sets = [*prefix.sets, *(frozenset(n for n, _ in ws) for ws in context[k:])]
            non_empty, self.unit_df, self.occurrences = prefix.counts()
            changed = [u for u in range(k) if context[u] is not prefix.words[u]]
            for u in changed:
                non_empty -= bool(self.sets[u])
                self.unit_df.subtract(self.sets[u])
                self.occurrences.subtract(n for n, _ in prefix.words[u])
                self.sets[u] = frozenset(n for n, _ in context[u])
            for u in (*changed, *range(k, len(units))):
                non_empty += bool(self.sets[u])
                self.unit_df.update(self.sets[u])
                self.occurrences.update(n for n, _ in context[u])
        self.n_units = max(1, non_empty)
        self.anchor_limit = min(ANCHOR_MAX_UNITS, max(1, int(COMMON_SHARE * self.n_units)))
        self.common_limit = max(1, int(COMMON_SHARE * self.n_units))
        self.drafter = drafter

    def idf(self, norm: str) -> float:
        return math.log(1.0 + self.n_units / max(1, self.unit_df[norm]))

    def tokens(self, unit_ids: Iterable[int]) -> int:
        spans = (self.drafter.token_span(*self.units[u]) for u in unit_ids)
        return sum(len(s) for s in canonicalize(spans))


def _anchor_scores(
    ctx: _Context,
    keys: set[str],
    grams: set[tuple[str, ...]],
    query_words: set[str],
    rare_max_freq: int,
) -> tuple[dict[int, float], set[int], set[int]]:
    """Unit -> score for every unit anchored by a rare query word or a rare shared n-gram,
    the units the question names (`AnchoredUnit.named`), and the strong anchors among them: a shared n-gram, or a shared word of `keys` (query
    words that name something), in at most `rare_max_freq` units (a key, not a topic word;
    only these seed the cascade). Why the word must name something: in a short context a
    plain word is rare by chance - "sites" in the question met "site.py" in a docstring,
    and the cascade followed "package" through seventeen docstring lines that filled the
    budget (aggregation at 2K, docs/BENCHMARK_NOTEBOOK.md).

    A unit is named by such a key, by a shared phrase of >= `PHRASE_MIN_WORDS` words, or
    (`_anchor_quotes`) by a quote. Why the key must be rare too: a name that many units
    repeat is what the documents are about, not a key to one of them. In a prompt of
    encyclopedia articles about pubs, "Arms" and "London" of the question stood in 8 units
    each; kept first, they filled a 4K budget before the passage signals reached the
    article the question's second hop needs (RULER qa_2, docs/BENCHMARK_NOTEBOOK.md)."""
    first_words = {g[0] for g in grams}
    matched_grams: list[dict[tuple[str, ...], int]] = []
    gram_df: Counter = Counter()
    phrases: dict[int, int] = {}  # unit -> longest shared phrase (>= PHRASE_MIN_WORDS words)
    long_grams: set[tuple[str, ...]] = set()  # shared phrases of >= PHRASE_MIN_WORDS words
    for u_index, ws in enumerate(ctx.words):
        norms = [n for n, _ in ws]
        found: dict[tuple[str, ...], int] = {}
        for i, n in enumerate(norms):
            if n not in first_words:
                continue
            length = 1
            while (
                length < MAX_NGRAM
                and i + length < len(norms)
                and tuple(norms[i : i + length + 1]) in grams
            ):
                length += 1
            content_words = sum(not stop for _, stop in ws[i : i + length])
            if length >= 2 and content_words:
                found[tuple(norms[i : i + length])] = length
                if length >= PHRASE_MIN_WORDS and content_words >= 2:
                    phrases[u_index] = max(phrases.get(u_index, 0), length)
                    long_grams.add(tuple(norms[i : i + length]))
        matched_grams.append(found)
        gram_df.update(found.keys())

    scores: dict[int, float] = {}
    strong: set[int] = set()
    named: set[int] = set()
    phrase_tier: list[int] = []
    for u, shared in enumerate(ctx.sets):
        hits = shared & query_words
        gram_hits = {g: n for g, n in matched_grams[u].items() if gram_df[g] <= ctx.anchor_limit}
        rare = [w for w in hits if ctx.unit_df[w] <= ctx.anchor_limit]
        if not rare and not gram_hits:
            common = [g for g in matched_grams[u] if gram_df[g] <= PHRASE_MAX_SHARE * ctx.n_units]
            if u in phrases and any(len(g) >= PHRASE_MIN_WORDS for g in common):
                phrase_tier.append(u)
            continue
        score = sum(ctx.idf(w) for w in hits if ctx.unit_df[w] <= ctx.common_limit)
        score += max(gram_hits.values(), default=1) - 1
        scores[u] = score
        key = any(ctx.unit_df[w] <= rare_max_freq for w in rare if w in keys)
        if key or any(g in long_grams for g in gram_hits):
            named.add(u)
        if key or any(gram_df[g] <= rare_max_freq for g in gram_hits):
            strong.add(u)
    scores.update(_phrase_tier_scores(ctx, phrase_tier, phrases))
    named.update(phrase_tier)
    return scores, strong, named


def _phrase_tier_scores(
    ctx: _Context, tier: Sequence[int], phrases: dict[int, int]
) -> dict[int, float]:
    """The lowest tier, after every key: units sharing only a long phrase with the question.
    Longer phrases first; among equal ones, units repeated word for word before singletons
    (`REPEAT_BONUS`, under one phrase word). Why: when the tier is larger than the budget
    (54 "Keyword log entry: ..." lines of about 9.5 tokens against a 4K prompt's budget of
    about 410), document order chose which lines survived, so the repeated lines a "which
    appear most often" question counts were cut as often as singletons; a repeated line
    stands for more of the text's occurrences of the phrase than a singleton does."""
    text_of = {u: tuple(n for n, _ in ctx.words[u]) for u in tier}
    copies = Counter(text_of.values())
    return {
        u: PHRASE_SCORE * (phrases[u] + REPEAT_BONUS * (1 - 1 / copies[text_of[u]])) for u in tier
    }


def _anchor_quotes(
    ctx: _Context,
    patterns: Sequence[re.Pattern[str]],
    excluded: Sequence[tuple[int, int]],
    scores: dict[int, float],
    strong: set[int],
    named: set[int],
    rare_max_freq: int,
) -> None:
    """Adds the units holding a quoted string (`quoted_patterns`) to the anchor `scores`,
    the `named` units and, when at most `rare_max_freq` units hold it, the `strong` ones.
    In at most `anchor_limit` units the quote is a key, `QUOTE_SCORE` above the unit's own
    score; in more (but not most) units it is a phrase, in the lowest tier ("how many lines
    say 'connection reset'?"). A match inside the question or a pinned span is not one."""
    text = ctx.drafter.text
    starts = [b for b, _ in ctx.units]
    for pattern in patterns:
        hit: set[int] = set()
        for m in pattern.finditer(text):
            if any(xb < m.end() and m.start() < xe for xb, xe in excluded):
                continue
            u = max(0, bisect.bisect_right(starts, m.start()) - 1)
            while u < len(ctx.units) and ctx.units[u][0] < m.end():
                if ctx.units[u][1] > m.start():
                    hit.add(u)
                u += 1
        if len(hit) <= ctx.anchor_limit:
            for u in hit:
                scores[u] = scores.get(u, 0.0) + QUOTE_SCORE
                if len(hit) <= rare_max_freq:
                    strong.add(u)
        elif len(hit) <= PHRASE_MAX_SHARE * ctx.n_units:
            for u in hit:
                scores.setdefault(u, PHRASE_SCORE * MAX_NGRAM)
        else:
            continue
        named.update(hit)


def _cascade(
    ctx: _Context,
    found: dict[int, tuple[float, int, str]],
    seeds: set[int],
    query_words: set[str],
    params: LexicalParams,
) -> None:
    """Follow rare words out of the anchored units, one hop per round (§4.2 on words).

    Seeds of round 1 are the strong anchors (a topic word shared with the question would
    start chains through unrelated text), of round k the units reached in round k-1. A rare
    word occurs at most `rare_max_freq` times in the context (and at least twice, or it
    links nothing), is no stopword and no query word. A seed whose rare words lead to more
    than `MAX_FANOUT` units not yet anchored passes nothing on: a link of a chain ("VAR
    FGHIJ = VAR ABCDE.") names the next link and the one before it, while a sentence of
    prose holds several words that happen to occur twice in the text (a year, a town, a
    name), each leading to an unrelated document. Why: on RULER's HotpotQA prompts the
    cascade went from the question's own sentences through "Glasgow", "1978" and "4" of
    "Document 4:" into 30 (4K) to 150 (8K) units of other articles, all kept before the
    passage signals' choice, and the second hop fell out (docs/BENCHMARK_NOTEBOOK.md).
    Mutates `found`.
    """
    holders: dict[str, list[int]] = defaultdict(list)
    for u, ws in enumerate(ctx.sets):
        for n in ws:
            if 2 <= ctx.occurrences[n] <= params.rare_max_freq:
                holders[n].append(u)
    stop_norms = {n for ws in ctx.words for n, stop in ws if stop}
    for hop in range(1, params.cascade_iters + 1):
        reached: dict[int, float] = {}
        for u in sorted(seeds):
            links = {
                v
                for n in ctx.sets[u]
                if n in holders and n not in query_words and n not in stop_norms
                for v in holders[n]
                if v not in found
            }
            if len(links) > MAX_FANOUT:
                continue
            for v in links:
                reached[v] = max(reached.get(v, 0.0), found[u][0] * HOP_DECAY)
        if not reached:
            return
        if params.cap_tokens is not None and ctx.tokens([*found, *reached]) > params.cap_tokens:
            return  # this round would anchor too much: revert it and stop
        for v, s in reached.items():
            found[v] = (s, hop, "cascade")
        seeds = set(reached)


# ----------------------------------------------------------------------------- code headers


def _headers(
    text: str,
    units: Sequence[tuple[int, int]],
    found: dict[int, tuple[float, int, str]],
    named: set[int],
    excluded: Sequence[tuple[int, int]],
    drafter: TokenizedText,
) -> list[AnchoredUnit]:
    """For each anchored unit on an indented line, its block header (`block_header`: the
    nearest less indented line above, when it opens a block): the `def`/`class` line that
    names the function a matched docstring line belongs to. Scored
    just below the hit, named when the hit is. Linear: line starts come from one pass over
    the units in text order and each line's header is looked up once (a long line holds
    hundreds of units; searching back from each was quadratic)."""
    line_of: dict[int, int] = {}
    line_start, prev = 0, 0
    for u in sorted(found, key=lambda u: units[u][0]):
        b = units[u][0]
        nl = text.rfind("\n", prev, b)
        line_start = nl + 1 if nl >= 0 else line_start
        line_of[u], prev = line_start, b
    header_of: dict[int, tuple[int, int] | None] = {}
    out = []
    for u, (score, hop, _) in found.items():
        start = line_of[u]
        if start not in header_of:
            header_of[start] = block_header(text, start, excluded)
        chars = header_of[start]
        if chars is not None:
            span = drafter.token_span(*chars)
            out.append(AnchoredUnit(span, score - HEADER_GAP, hop, "header", u in named))
    return out


def _best_per_span(units: Iterable[AnchoredUnit]) -> list[AnchoredUnit]:
    best: dict[Span, AnchoredUnit] = {}
    for a in units:
        if a.span.empty:
            continue
        if a.span not in best or a.score > best[a.span].score:
            named = a.named or (a.span in best and best[a.span].named)
            best[a.span] = a if a.named == named else dataclasses.replace(a, named=named)
        elif a.named and not best[a.span].named:
            best[a.span] = dataclasses.replace(best[a.span], named=True)
    return list(best.values())
