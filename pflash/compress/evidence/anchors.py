"""Anchors: the context units that share rare words, a phrase or a quoted string with the
question (the reference's 4-gram anchors, ALGORITHM.md §4.1 step 3, on words), and their
scores. `lexical.find_lexical_evidence` reads the query pool and calls these; its cascade
follows rare words out of the anchors found here.

- Context: every word outside the query pool and the pinned spans (`Context`: per unit, its
  word set, and the frequencies the rules read).
- Anchors: a context unit holding a rare query word, or a query word n-gram (>= 2 words,
  one of them not a stopword), that occurs in at most `ANCHOR_MAX_UNITS` units (and in at
  most `COMMON_SHARE` of them). Scored by the IDF of the distinct query words it holds plus
  a bonus for the longest shared n-gram. The question names it (`AnchoredUnit.named`) when
  it shares a key (a word that names something, in at most `rare_max_freq` units), a
  phrase of 3+ words or a quote (`anchor_scores`).
  A unit that only shares a longer phrase with the question (>= 3 words, two of them
  content words) that many units repeat - the log lines a counting question is about -
  is anchored in the lowest tier: after every key, before attention; in it, units
  repeated word for word come before singletons (`_phrase_tier_scores`).
  A string the question quotes ("...", `...`, '...', “...”) is matched character for
  character (case and runs of whitespace aside, a closing ".,;:!?" optional): the units it
  sits in are keys scored above any shared n-gram, or phrase-tier units when many repeat
  it (`quoted_patterns`, `anchor_quotes`). Why: words drop the symbols that tell "Same as
  a *= b." from a dozen other "Same as a ... b." docstrings, and a user who quotes a line
  means that line.

Pure: `re` and the standard library.
"""

from __future__ import annotations

import bisect
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence

from pflash.compress.evidence.words import UnitPrefix, words
from pflash.spans import TokenizedText, canonicalize

MAX_NGRAM = 6  # words; longer shared runs score as 6
ANCHOR_MAX_UNITS = 8  # a query word or n-gram in more units is a phrase, not a key (§4.1 max_hits)
COMMON_SHARE = 0.10  # ... and so is one in more than this share of the units
PHRASE_MIN_WORDS = 3  # a phrase of the question repeated in many units: "keyword log entry"
PHRASE_MAX_SHARE = 0.5  # ... but not in most of them (boilerplate)
PHRASE_SCORE = 1e-3  # per phrase word: phrase units rank after every key anchor and hop
REPEAT_BONUS = 0.5  # phrase units repeated word for word rank first in their tier (< 1 word)
QUOTE_SCORE = float(MAX_NGRAM)  # a quoted string outranks any shared n-gram's bonus

QUOTE_MAX_CHARS = 300  # longer "quotes" are more likely two unrelated quote marks
# quotes read per source (the question, `pflash_query`): each is one case-insensitive
# search of the whole text, up to QUOTE_MAX_CHARS steps per character; a question quotes a
# string or two, a crafted `pflash_query` could quote hundreds
MAX_QUOTES = 4

_QUOTED = re.compile(
    rf'"([^"\n]{{3,{QUOTE_MAX_CHARS}}})"|“([^”\n]{{3,{QUOTE_MAX_CHARS}}})”'
    rf"|`([^`\n]{{3,{QUOTE_MAX_CHARS}}})`|(?<!\w)'([^'\n]{{3,{QUOTE_MAX_CHARS}}})'(?!\w)"
)


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


class Context:
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


def anchor_scores(
    ctx: Context,
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
    and the cascade followed "package" through docstring lines until they filled the
    budget (aggregation, docs/BENCHMARK_NOTEBOOK.md).

    A unit is named by such a key, by a shared phrase of >= `PHRASE_MIN_WORDS` words, or
    (`anchor_quotes`) by a quote. Why the key must be rare too: a name that many units
    repeat is what the documents are about, not a key to one of them. In a prompt of
    encyclopedia articles about pubs, "Arms" and "London" of the question stood in several
    units each; kept first, they filled the budget before the passage signals reached the
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
    ctx: Context, tier: Sequence[int], phrases: dict[int, int]
) -> dict[int, float]:
    """The lowest tier, after every key: units sharing only a long phrase with the question.
    Longer phrases first; among equal ones, units repeated word for word before singletons
    (`REPEAT_BONUS`, under one phrase word). Why: when the tier is larger than the budget
    (a log of "Keyword log entry: ..." lines, more than a short prompt's budget holds),
    document order chose which lines survived, so the repeated lines a "which appear most
    often" question counts were cut as often as singletons; a repeated line
    stands for more of the text's occurrences of the phrase than a singleton does."""
    text_of = {u: tuple(n for n, _ in ctx.words[u]) for u in tier}
    copies = Counter(text_of.values())
    return {
        u: PHRASE_SCORE * (phrases[u] + REPEAT_BONUS * (1 - 1 / copies[text_of[u]])) for u in tier
    }


def anchor_quotes(
    ctx: Context,
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
