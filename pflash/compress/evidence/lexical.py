"""Lexical evidence for strict selection: text that shares rare words with the question.

Why: a small drafter (SmolLM2-135M) ranks evidence poorly by attention alone. At a 10%
budget the needle, the several values under one key, the links of a variable chain or the
function whose docstring the user quotes are often dropped, although the question names
them. Retrieval questions repeat a rare key that also sits next to the answer (the
reference's 4-gram anchors, ALGORITHM.md §4.1 step 3); multi-hop chains are linked by rare
names that only the previous hop mentions (the transitive cascade, §4.2).

The rules work on words of the drafter text (`words`: why words, not BPE tokens); only the
output spans are in **drafter tokens** (`Plan.drafter`). `find_lexical_evidence` runs them
in order:

1. Units: the text cut at newlines and sentence ends (`words.split_units`). A unit is what
   gets anchored and kept.
2. Query pool: the questions of the latest user turn wherever they sit - at its edges, or
   set as their own paragraph inside a pasted document (mode `question`) - or its last
   `query_tokens` tokens (mode `tail`, the reference rule); plus the pinned question span
   and the explicit `pflash_query`.
3. Context: every word outside the query pool and the pinned spans (`anchors.Context`).
4. Anchors: the context units that share a rare query word, a query n-gram, a long phrase or
   a quoted string with the question (`anchors`: the rules and their scores). An indented
   hit also anchors its header line (the `def` above a docstring line), scored just below
   it.
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
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from pflash.compress.evidence.anchors import (
    MAX_NGRAM,
    Context,
    anchor_quotes,
    anchor_scores,
    quoted_patterns,
)
from pflash.compress.evidence.antecedents import passage_antecedents
from pflash.compress.evidence.words import (
    MAX_UNIT_CHARS,
    UnitPrefix,
    Word,
    context_words,
    cut_long,
    is_question_like,
    key_words,
    split_units,
    units_before,
    words,
)
from pflash.compress.plan.query import Plan
from pflash.compress.text.code_headers import block_header
from pflash.spans import Span, TokenizedText, canonicalize

LexicalMode = Literal["anchors", "cascade"]
LexicalQuery = Literal["question", "tail"]

HOP_DECAY = 0.9  # cascade: a unit reached in hop k scores 0.9^k of its parent
MAX_FANOUT = 1  # cascade: a unit whose rare words reach more new units is no chain link
HEADER_GAP = 1e-3  # a header scores this much below its hit, so it is promoted right after
WHOLE_SENTENCE_CHARS = 3 * MAX_UNIT_CHARS  # a sentence this long is promoted whole after its hit
REFERENT_MIN_SHARE = 0.9  # hits this close to the best anchor their antecedent (`_referents`)

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
    context = context_words(text, units, excluded, known=prefix.words)
    ctx = Context(units, context, drafter, prefix)

    scores, strong, named = anchor_scores(
        ctx, query_words & keys, grams, query_words, params.rare_max_freq
    )
    quotes = quoted_patterns(text, pool_ranges)
    if pflash_query:
        quotes += quoted_patterns(pflash_query, [(0, len(pflash_query))])
    anchor_quotes(ctx, quotes, excluded, scores, strong, named, params.rare_max_freq)
    found: dict[int, tuple[float, int, str]] = {u: (s, 0, "anchor") for u, s in scores.items()}
    if params.mode == "cascade":
        _cascade(ctx, found, strong, query_words, params)
    named |= {u for u, (_, hop, _) in found.items() if hop}  # reached from a key
    out = [
        AnchoredUnit(drafter.token_span(*units[u]), s, hop, reason, u in named)
        for u, (s, hop, reason) in found.items()
    ]
    out.extend(_headers(text, units, found, named, excluded, drafter))
    out.extend(_referents(text, units, found, named, drafter))
    out.extend(_whole_sentences(units, sentences, found, named, drafter))
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


# ----------------------------------------------------------------------------- cascade


def _cascade(
    ctx: Context,
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


def _referents(
    text: str,
    units: Sequence[tuple[int, int]],
    found: dict[int, tuple[float, int, str]],
    named: set[int],
    drafter: TokenizedText,
) -> list[AnchoredUnit]:
    """For each best hit (within `REFERENT_MIN_SHARE` of the best hit's score) that opens a
    sentence naming its subject by a pronoun, the sentence naming the subject
    (`antecedents.passage_antecedents`): scored just below the hit, named when the hit is, as
    a docstring hit's header is. Why: a kept "Noted for his role as Homer Simpson, he also
    voices ..." answers nothing without "Daniel Louis Castellaneta is an American actor"
    before it (RULER's qa_2, docs/BENCHMARK_NOTEBOOK.md). Only the best hits: a question's
    names often anchor more than the budget holds, and the antecedents of every hit, even
    ranked after all of them, took the room of the answer the embedder ranked first (RULER's
    qa_2, seed 52140). Only back: the sentences after a hit that refer back to it are left
    to the passage signals, which read them after it."""
    if not found:
        return []
    floor = REFERENT_MIN_SHARE * max(score for score, _, _ in found.values())
    hits = sorted(u for u, (score, _, _) in found.items() if score >= floor)
    out = []
    for u, (a, end) in zip(hits, passage_antecedents(text, [units[u] for u in hits]), strict=True):
        if a >= 0:
            score, hop, _ = found[u]
            span = drafter.token_span(a, end)
            out.append(AnchoredUnit(span, score - HEADER_GAP, hop, "referent", u in named))
    return out


def _whole_sentences(
    units: Sequence[tuple[int, int]],
    sentences: Sequence[tuple[int, int]],
    found: dict[int, tuple[float, int, str]],
    named: set[int],
    drafter: TokenizedText,
) -> list[AnchoredUnit]:
    """For each anchored piece of a sentence cut in pieces (longer than `MAX_UNIT_CHARS`,
    at most `WHOLE_SENTENCE_CHARS`), the whole sentence: scored just below the piece, named
    when it is, so the rest is promoted right after it where the budget holds it (a span
    is promoted whole or not at all). Why: SQuAD's answer sentences run to 500 characters;
    the piece holding the question's words was kept and the rest, "... the Singing
    Revolution to bring independence to the Baltic countries ...", was cut (RULER's qa_1,
    docs/BENCHMARK_NOTEBOOK.md). A longer "sentence" (a minified line, a table row) is
    anchored in pieces as before."""
    long = [(b, e) for b, e in sentences if MAX_UNIT_CHARS < e - b <= WHOLE_SENTENCE_CHARS]
    if not long:
        return []
    starts = [b for b, _ in long]
    out = []
    for u, (score, hop, _) in found.items():
        k = bisect.bisect_right(starts, units[u][0]) - 1
        if k >= 0 and units[u][1] <= long[k][1]:
            span = drafter.token_span(*long[k])
            out.append(AnchoredUnit(span, score - HEADER_GAP, hop, "sentence", u in named))
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
