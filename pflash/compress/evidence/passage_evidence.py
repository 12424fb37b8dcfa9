"""Passage evidence in strict selection: passages that answer the question in other words.

Why: attention at the drafter's scoring layer does not connect a paraphrased question to its
evidence (docs/BENCHMARK_NOTEBOOK.md, the paraphrased families). Two signals can, each scored per passage of the text
before the question and mixed into the token scores (a third, question likelihood as in
LongLLMLingua's coarse ranking, is left out: it moves retention little for several times the
compression time; docs/BENCHMARK_NOTEBOOK.md):

- **semantic** (`select_semantic_weight`): a sentence embedder trained to pair questions
  with the passages that answer them (`pflash.models.embedder`); cosine of question and
  passage.
- **projection** (`select_projection_weight`): a linear projection of the drafter's own tap
  trained on question/evidence pairs (`pflash.models.projection`, `pflash projection
  train`); cosine of the pooled question rows and each passage's pooled rows. No second
  model: the rows come from the drafter pass selection already runs.

Two pure steps around the drafter call:

1. `evidence_question` and `evidence_passages` (prepare): the question is the one the
   latest user turn closes with (`question_tail`: its last line or sentences, not the chat
   template after it), else the tail of the query span; the droppable text before it is cut
   into passages of at most `max_tokens` drafter tokens at sentence and line starts (the
   units of `pflash.compress.evidence.words.split_units`), so a fact is rarely split across two
   passages. Pinned spans are kept anyway and never scored.
2. `mix_evidence` (finish): per signal, each passage's score above the median passage's,
   spread over its tokens and normalised to sum 1 over the context, mixed with the attention
   scores (also normalised to sum 1 over the context):
   `score = (1 - sum w) * attention + sum_k w_k * signal_k`. Tokens from the question on keep
   their attention scores (they are mandatory). Before the mix: each signal on one scale
   (`part_shares`), the entity the best passages name is followed for all of them
   (`entity_feedback`), and per signal code blocks (`code_blocks`, the embedder's scores for
   each function read whole) and code headers are lifted, and with
   `select_passage_cuts` the parts of one sentence share its best score (`whole_sentences`);
   selection then cuts its candidates at the passages (`passage_cuts`).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from pflash.compress.evidence.antecedents import (
    antecedent_prefix,
    lift_antecedents,
    passage_antecedents,
)
from pflash.compress.evidence.bridge import lift_groups, second_hop
from pflash.compress.evidence.code_blocks import (
    CodeBlock,
    block_texts,
    lift_blocks,
    passage_blocks,
    passage_headers,
)
from pflash.compress.evidence.entity_feedback import followed_passages, lift_passages
from pflash.compress.evidence.framing import framing_lines, with_space
from pflash.compress.evidence.words import answers_form, split_units
from pflash.compress.plan.query import Plan, question_tail
from pflash.compress.scoring import ScoreRequest, ScoreResult
from pflash.compress.selection.candidates import Candidates, split_candidates
from pflash.compress.text.sentences import ends_sentence, split_sentences
from pflash.compress.turn_memo import TurnMemo
from pflash.config import SelectionConfig
from pflash.errors import CompressionFailed
from pflash.spans import Span, TokenizedText, subtract

QUESTION_TOKENS = 64  # the question's tail when no question closes the latest user turn
SEMANTIC_QUESTION_TOKENS = 256  # the embedder reads a multi-part question whole
# a code header read with each passage of its block: its first characters name the
# function; a whole header line of 10^6 characters, copied into each of 10^4 passages, is
# quadratic
HEADER_MAX_CHARS = 256


def evidence_question(plan: Plan, max_tokens: int = QUESTION_TOKENS) -> Span | None:
    """The question the passages are scored against (drafter tokens): the one
    closing the latest user turn when the query is the prompt's end (chat), else the last
    `max_tokens` of the query span (an explicit `pflash_query`, raw text). None when it has
    fewer than 2 tokens (the baseline needs one token of context)."""
    span = None
    if plan.query_rule == "prompt_end" and plan.content is not None:
        span = question_tail(plan.drafter, plan.drafter.char_span(plan.content), max_tokens)
    if span is None:
        qs = plan.query_span
        span = Span(max(qs.begin, qs.end - max_tokens), qs.end)
    return span if len(span) >= 2 else None


def question_parts(question: str) -> tuple[str, ...]:
    """What the embedder compares each passage with: the question, then each of its
    sentences and lines when it has several. Why: one embedding of "When was it founded?
    Where is it based? Who runs it?" sits between its parts and near none of their answers;
    a passage scores its best match (`combine_questions`).

    Instructions on the answer's form closing the question ("Answer briefly.", "Answer with
    that routine alone.", "Please reply in one word."; `answers_form`), after its last
    sentence that asks ("?"), are left out, of the whole too: as a part of its own such a
    sentence ranks its own best passages first, and they match it, not the question."""
    whole = question.strip()
    parts = split_sentences(whole)
    asked = [i for i, p in enumerate(parts) if p.endswith("?")]
    keep = len(parts)
    while asked and keep - 1 > asked[-1] and answers_form(parts[keep - 1]):
        keep -= 1
    if keep < len(parts):
        parts = parts[:keep]
        end = 0
        for p in parts:  # the parts are stripped pieces of the text, in order
            end = whole.index(p, end) + len(p)
        whole = whole[:end]
    return (whole,) if len(parts) < 2 else (whole, *parts)


def combine_questions(sims: np.ndarray) -> np.ndarray:
    """Each passage's best match over the question parts, float64 [passages] (from cosines
    [parts, passages]): per part, the cosine above that part's median passage, as a share
    of its best passage's; then the maximum over parts. Why per part: raw cosines of
    different parts are on different scales (a part about money sits closer to every
    sentence with a number), so the raw maximum lets one part take the whole budget; this
    way each part's best passages rank first. With one part it orders the passages as the
    raw cosine does."""
    sims = np.asarray(sims, dtype=np.float64)
    if not sims.size:
        return np.zeros(sims.shape[1] if sims.ndim == 2 else 0)
    return part_shares(sims).max(axis=0)


def part_shares(sims: np.ndarray) -> np.ndarray:
    """Per row (question part or signal) of [rows, passages], each passage's score above the
    row's median passage as a share of the row's best (0 at or below the median), float64."""
    sims = np.asarray(sims, dtype=np.float64)
    if not sims.size:
        return sims
    med = np.median(sims, axis=1, keepdims=True)
    top = sims.max(axis=1, keepdims=True)
    return np.maximum(sims - med, 0.0) / np.where(top > med, top - med, 1.0)


def evidence_passages(
    drafter: TokenizedText,
    context_end: int,
    pinned: Sequence[Span],
    *,
    max_tokens: int,
    begin: int = 0,
    known: Mapping[tuple, tuple[Span, ...]] | None = None,
    made: dict[tuple, tuple[Span, ...]] | None = None,
) -> tuple[Span, ...]:
    """Passages (drafter spans, source order, disjoint) tiling `[begin, context_end)` minus
    the pinned spans and the lines that frame the documents (`framing_lines`), each at most
    `max_tokens` long, cut at sentence and line starts where possible. Each region between
    them is cut on its own, so a region's passages do not depend on what comes after it.

    `known`: regions an earlier turn of the conversation cut (its `made`), by `region_key`:
    a region with the same bounds, text and token offsets is not cut again. `made`: filled
    with this call's regions, for the next turn."""
    out: list[Span] = []
    c0, c1 = drafter.char_span(Span(begin, max(begin, context_end)))
    frames = [
        drafter.token_span(*with_space(drafter.text, b, e))
        for b, e in framing_lines(drafter.text, c0, c1)
    ]
    for region in subtract([Span(begin, context_end)], [*pinned, *frames]):
        if region.empty:
            continue
        key = (
            region_key(drafter, region, max_tokens)
            if known is not None or made is not None
            else None
        )
        passages = known.get(key) if known is not None else None
        if passages is None:
            passages = _cut_region(drafter, region, max_tokens)
        if made is not None:
            made[key] = passages
        out.extend(passages)
    return tuple(out)


def region_key(drafter: TokenizedText, region: Span, max_tokens: int) -> tuple:
    """What a region's passages are a function of: its bounds, the passage length, its text
    and its tokens' character offsets (hashing them costs a fraction of cutting the region
    again)."""
    c0, c1 = drafter.char_span(region)
    return (
        region.begin,
        region.end,
        max_tokens,
        drafter.text[c0:c1],
        drafter.offsets[region.begin : region.end],
    )


def _cut_region(drafter: TokenizedText, region: Span, max_tokens: int) -> tuple[Span, ...]:
    c0, c1 = drafter.char_span(region)
    starts = sorted(
        {region.begin}
        | {
            t
            for b, _ in split_units(drafter.text, c0, c1, max_chars=None)
            if region.begin < (t := drafter.token_containing(b)) < region.end
        }
    )
    return tuple(_group(starts + [region.end], max_tokens))


def _group(cuts: list[int], max_tokens: int) -> list[Span]:
    """Consecutive pieces between `cuts` joined up to `max_tokens`; a longer piece is cut in
    `max_tokens`-long parts."""
    out: list[Span] = []
    begin = cuts[0]
    for prev, cut in zip(cuts, cuts[1:], strict=False):
        if cut - begin > max_tokens and prev > begin:
            out.append(Span(begin, prev))
            begin = prev
        while cut - begin > max_tokens:
            out.append(Span(begin, begin + max_tokens))
            begin += max_tokens
    if cuts[-1] > begin:
        out.append(Span(begin, cuts[-1]))
    return out


def passage_token_scores(n: int, passages: Sequence[Span], gains: np.ndarray) -> np.ndarray:
    """Per-token passage evidence, float64 [n]: each passage's score above the median
    passage's (0 when below), on each of its tokens; 0 outside the passages."""
    gains = np.asarray(gains, dtype=np.float64)
    if gains.shape != (len(passages),):
        raise ValueError(f"{gains.shape[0]} passage scores for {len(passages)} passages")
    out = np.zeros(n, dtype=np.float64)
    if not len(passages):
        return out
    above = np.maximum(gains - np.median(gains), 0.0)
    for span, g in zip(passages, above, strict=True):
        out[span.begin : span.end] = g
    return out


@dataclass(frozen=True)
class PassageSignal:
    """One signal's per-passage scores (drafter spans) and its weight in the mix."""

    passages: tuple[Span, ...]
    scores: np.ndarray
    weight: float


def mix_evidence(
    token_scores: np.ndarray, signals: Sequence[PassageSignal], *, context_end: int
) -> np.ndarray:
    """`(1 - sum w) * attention + sum_k w_k * signal_k` over `[0, context_end)`, each part
    normalised to sum 1 there (a part that sums to 0 stays 0); tokens from `context_end` on
    keep `token_scores`. Returns float64 [n]."""
    scores = np.asarray(token_scores, dtype=np.float64)
    ctx = slice(0, context_end)
    out = scores.copy()
    out[ctx] = (1.0 - sum(s.weight for s in signals)) * _unit_sum(scores[ctx])
    for s in signals:
        part = passage_token_scores(scores.shape[0], s.passages, s.scores)
        out[ctx] += s.weight * _unit_sum(part[ctx])
    return out


def evidence_request(
    plan: Plan,
    pinned: Sequence[Span],
    config: SelectionConfig,
    *,
    suffix: bool,
    memo: TurnMemo | None = None,
    conversation: str | None = None,
) -> dict[str, Any]:
    """What the drafter scores by the sentence embedder and the tap projection, when asked
    for: passages of the droppable text before the question (the
    projection scores the embedder's passages against the same question span). Not in the agent loop
    (`suffix`): its candidates after the question have no passage, so the scores would not be
    on one scale. Returns the ScoreRequest fields. `memo`: the regions the conversation's
    earlier turn cut (`evidence_passages`' `known`); the passages are the same without it."""
    want_semantic = config.select_semantic_weight > 0
    want_projection = config.select_projection_weight > 0
    if not (want_semantic or want_projection) or suffix:
        return {}
    question = evidence_question(plan)
    if question is None:
        return {}
    question = evidence_question(plan, SEMANTIC_QUESTION_TOKENS) or question
    end = min(question.begin, plan.query.begin)
    out: dict[str, Any] = {}
    known = memo.get(conversation, "passages") if memo is not None else None
    made: dict[tuple, tuple[Span, ...]] | None = {} if memo is not None else None
    semantic = evidence_passages(
        plan.drafter,
        end,
        pinned,
        max_tokens=config.semantic_passage_tokens,
        known=known,
        made=made,
    )
    blocks = passage_blocks(plan.drafter, semantic) if want_semantic else ()
    if blocks:
        out["evidence_blocks"] = tuple(b.span for b in blocks)
    if semantic and want_projection:
        out |= {"projection_passages": semantic, "projection_question": question}
    if semantic and want_semantic:
        text = plan.drafter.text
        out |= {
            "semantic_passages": semantic,
            "semantic_texts": passage_texts(plan.drafter, semantic)
            + block_texts(plan.drafter, blocks),
            "semantic_questions": question_parts(text[slice(*plan.drafter.char_span(question))]),
        }
    if want_semantic:  # what the next question will read as passages, embedded now
        after = evidence_passages(
            plan.drafter,
            plan.n_tokens,
            pinned,
            max_tokens=config.semantic_passage_tokens,
            begin=question.end,
            known=known,
            made=made,
        )
        if after:
            out["semantic_prefetch"] = passage_texts(plan.drafter, after)
    if memo is not None and made:
        memo.put(conversation, "passages", made, sum(len(k[3]) for k in made))
    return out


def whole_sentences(
    drafter: TokenizedText, passages: Sequence[Span], values: np.ndarray
) -> np.ndarray:
    """Per-passage scores where the parts of a sentence cut in several passages (a sentence
    longer than the passage length) all score the best part's score. Why: with
    `select_passage_cuts` each part is a candidate of its own, and the part holding the
    answer's key words would be kept without the rest of its sentence. A part continues the
    passage before it when the two touch and neither the earlier ends a sentence or line nor
    the later opens a line."""
    out = np.asarray(values, dtype=np.float64).copy()
    pieces = [drafter.text[slice(*drafter.char_span(p))] for p in passages]
    run = [0]
    for i in range(1, len(passages) + 1):
        joined = (
            i < len(passages)
            and passages[i - 1].end == passages[i].begin
            and not ends_sentence(pieces[i - 1])
            and "\n" not in pieces[i][: len(pieces[i]) - len(pieces[i].lstrip())]
        )
        if joined:
            run.append(i)
            continue
        if len(run) > 1:
            out[run] = out[run].max()
        run = [i]
    return out


def passage_cuts(signals: Sequence[PassageSignal]) -> np.ndarray:
    """Every passage bound of `signals` (drafter tokens, sorted, unique): where candidates are
    cut when `select_passage_cuts` is on. Why: with passage evidence a token's score is its
    passage's, and a chunk or probe segment ranked by its sum or density mixes passages, so
    three distractor sentences at 0.7 outrank one fact at 1.0 sharing its chunk with filler."""
    bounds = [b for s in signals for span in s.passages for b in (span.begin, span.end)]
    return np.unique(np.asarray(bounds, dtype=np.int64))


MIN_PIECE = 4  # drafter tokens: shorter slivers between a passage and a segment bound join on


def cut_at_passages(
    cands: Candidates, signals: Sequence[PassageSignal], token_scores: np.ndarray
) -> Candidates:
    """The candidates cut at every passage bound (`passage_cuts`) and scored by density,
    each piece at least `MIN_PIECE` tokens (a cut nearer a segment bound or the cut before
    it is skipped: the indentation or blank line between them is no candidate of its own)."""
    cuts = passage_cuts(signals)
    return split_candidates(cands, cuts, token_scores, kind="density", min_piece=MIN_PIECE)


def passage_signals(
    req: ScoreRequest,
    scores: ScoreResult,
    config: SelectionConfig,
    drafter: TokenizedText,
    *,
    whole_block_tokens: int = 0,
) -> list[PassageSignal]:
    """The passage scores asked for in prepare, checked: a missing, mis-sized or non-finite
    reply fails closed (stage drafter), never a selection without the asked signal. Semantic
    scores take each passage's best question part; the code blocks the embedder read whole
    are on one scale with its passages. Every signal then lifts each block's passages to
    the embedder's score for the block, and a block of at most `whole_block_tokens` drafter
    tokens to its best passage's as well (`code_blocks.lift_blocks`), and the header of the
    code block a passage sits in (`lift_code_headers`)."""
    asked = []
    blocks = _checked_blocks(req, drafter)
    if req.semantic_texts:
        shape = (len(req.semantic_questions), len(req.semantic_passages) + len(blocks))
        asked.append(
            (
                "semantic",
                req.semantic_passages,
                scores.semantic,
                shape,
                config.select_semantic_weight,
            )
        )
    if req.projection_passages:
        asked.append(
            (
                "projection",
                req.projection_passages,
                scores.projection,
                (len(req.projection_passages),),
                config.select_projection_weight,
            )
        )
    checked: list[_Checked] = []
    for name, passages, values, shape, weight in asked:
        if values is None or np.shape(values) != shape:
            got = "none" if values is None else f"{np.shape(values)}"
            raise CompressionFailed(
                "drafter", f"{name} scores of shape {shape} asked, {got} returned"
            )
        if not np.all(np.isfinite(values)):
            raise CompressionFailed("drafter", f"non-finite {name} scores")
        if len(shape) == 2:  # passages, then code blocks: one scale (`code_blocks`)
            values = combine_questions(values)
        else:
            values = part_shares(np.asarray(values)[None, :])[0]
        n = len(passages)
        checked.append(_Checked(name, tuple(passages), values[:n], weight, values[n:]))
    if config.select_entity_feedback:
        checked = _follow_entities(drafter, checked, _question_text(req, drafter))
    out = []
    read = next((c.blocks for c in checked if c.name == "semantic"), np.zeros(len(blocks)))
    antecedents: dict[tuple[Span, ...], tuple[list, list]] = {}  # per passages, once
    for c in checked:  # the embedder's block scores, for every signal (as entity feedback)
        values = lift_blocks(c.values, blocks, read, whole_tokens=whole_block_tokens)
        values = lift_code_headers(drafter, c.passages, values)
        if c.passages not in antecedents:
            spans = [drafter.char_span(p) for p in c.passages]
            antecedents[c.passages] = (spans, passage_antecedents(drafter.text, spans))
        spans, found = antecedents[c.passages]
        values = lift_antecedents(spans, values, found)
        if config.select_passage_cuts:  # after every lift: a sentence's parts go together
            values = whole_sentences(drafter, c.passages, values)
        out.append(PassageSignal(c.passages, values, c.weight))
    return out


def _checked_blocks(req: ScoreRequest, drafter: TokenizedText) -> tuple[CodeBlock, ...]:
    """The code blocks of the asked passages, as prepare found them: found again here (a
    pure function of the passages), and a request whose blocks differ fails closed."""
    blocks = passage_blocks(drafter, req.semantic_passages)
    if tuple(b.span for b in blocks) != tuple(req.evidence_blocks):
        raise CompressionFailed(
            "selection",
            f"{len(req.evidence_blocks)} code blocks asked, {len(blocks)} in the passages",
        )
    return blocks


@dataclass(frozen=True)
class _Checked:
    """One asked signal, checked: per-passage scores on the share scale (`part_shares`: 0 at
    or below the median passage, 1 at the best; the embedder's best over the question's
    parts)."""

    name: str
    passages: tuple[Span, ...]
    values: np.ndarray
    weight: float
    blocks: np.ndarray  # per evidence block, on the passages' scale


def _question_text(req: ScoreRequest, drafter: TokenizedText) -> str:
    """The question the passages were scored against, as text."""
    if req.semantic_questions:
        return req.semantic_questions[0]
    span = req.projection_question
    return drafter.text[slice(*drafter.char_span(span))] if span is not None else ""


def _follow_entities(
    drafter: TokenizedText, checked: list[_Checked], question: str = ""
) -> list[_Checked]:
    """`checked` with entity feedback (`entity_feedback`) applied: the signals over the same
    passages (the embedder's and the tap projection's) lift the passages of the same names,
    picked by the sentence embedder where it scored these passages, else by the signals'
    weighted mean. Why one pick, the embedder's: on the share scale the projection's best
    names are distractors in the aggregation cases, and its own lift (to 0.9 of its best raw
    cosine, before the share scale) lifts to about its median passage; the embedder's pick
    for both keeps more aggregation facts than each signal's own (docs/BENCHMARK_NOTEBOOK.md). The same pick
    follows the second hop of `question` (`bridge.second_hop`)."""
    out = list(checked)
    groups: dict[tuple[Span, ...], list[int]] = {}
    for k, c in enumerate(checked):
        groups.setdefault(c.passages, []).append(k)
    for passages, members in groups.items():
        texts = [drafter.text[slice(*drafter.char_span(p))] for p in passages]
        semantic = [checked[k] for k in members if checked[k].name == "semantic"]
        if semantic:
            picked = semantic[0].values
        else:
            total = sum(checked[k].weight for k in members) or 1.0
            picked = sum(checked[k].values * checked[k].weight for k in members) / total
        followed = followed_passages(texts, picked)
        hops = second_hop(texts, picked, question)
        for k in members:
            values = lift_passages(checked[k].values, followed)
            out[k] = replace(checked[k], values=lift_groups(values, hops))
    return out


def passage_texts(drafter: TokenizedText, passages: tuple[Span, ...]) -> tuple[str, ...]:
    """Each passage's text as the embedder reads it: inside a code block, after the
    block's header line (`def name(args):`, its first `HEADER_MAX_CHARS` characters)
    when the passage does not hold it; outside code, a passage that names its subject by a
    pronoun after the sentence it refers back to (`antecedents`). Why: a
    24-token piece of a function body ("isinstance(c, bytes)\n return") says little
    about what the function is for; with its header the docstring and body pieces read as
    parts of that function. "He is voiced by Dan Castellaneta" says nothing of Homer Simpson
    until it is read after "Homer Jay Simpson is a fictional character"."""
    text = drafter.text
    spans = [drafter.char_span(p) for p in passages]
    lines: dict[int, str] = {}  # header start -> its line: read once for all its passages
    back = passage_antecedents(text, spans)
    out = []
    for (b, e), header, before in zip(spans, passage_headers(drafter, spans), back, strict=True):
        piece = text[b:e]
        if header >= 0 and not b <= header < e:
            if header not in lines:
                stop = text.find("\n", header)
                stop = min(stop if stop >= 0 else len(text), header + HEADER_MAX_CHARS)
                lines[header] = text[header:stop].strip()
            piece = lines[header] + "\n" + piece
        elif header < 0:
            piece = antecedent_prefix(text, before) + piece
        out.append(piece)
    return tuple(out)


def lift_code_headers(
    drafter: TokenizedText, passages: tuple[Span, ...], values: np.ndarray
) -> np.ndarray:
    """Per-passage scores where the passage holding a code block's header (the `def` line)
    scores at least as high as any passage of the block's body. Why: a question that
    describes code ("which routine draws a random number below a bound?") matches the
    docstring and body, while what answers it is the header with the name; the body lines
    are kept by their own score. Text without code headers is unchanged."""
    out = np.asarray(values, dtype=np.float64).copy()
    spans = [drafter.char_span(p) for p in passages]
    begins = [b for b, _ in spans]
    for i, header in enumerate(passage_headers(drafter, spans)):
        h = bisect.bisect_right(begins, header) - 1
        if header < 0 or h < 0 or h == i or header >= spans[h][1]:
            continue  # no block, the header is pinned (no passage), or it is this passage
        out[h] = max(out[h], float(values[i]))
    return out


RECALL_PASSAGES = 1  # per signal: the best passages a view recalls for a new question
RECALL_MIN_SHARE = 0.9  # ... when within this share of the best passage (`part_shares`)


def recalled_evidence(signals: Sequence[PassageSignal], kept: Sequence[Span]) -> tuple[Span, ...]:
    """The kept parts of each signal's best passages: at most `RECALL_PASSAGES` per signal,
    scored at least `RECALL_MIN_SHARE` of the way from the median passage to the best.

    Why: recall (§6.2) brings back what a new question attends to, and the drafter's
    attention does not reach a passage that answers the question in other words; these
    passages are the ones the evidence signals found for it. Without them, a question worded
    without its tool output's words loses that output from the view while a fresh
    compression keeps it (the agent benchmark). Only what the fresh selection kept is returned, so recall
    never adds what a fresh compression of the same prompt would drop."""
    out: list[Span] = []
    for signal in signals:
        order = np.argsort(-np.asarray(signal.scores), kind="stable")[:RECALL_PASSAGES]
        for i in order.tolist():
            if float(signal.scores[i]) < RECALL_MIN_SHARE:
                break
            p = signal.passages[i]
            out += [
                Span(max(p.begin, k.begin), min(p.end, k.end))
                for k in kept
                if k.begin < p.end and p.begin < k.end
            ]
    return tuple(sorted(set(out)))


def evidence_stats(scores: ScoreResult) -> dict[str, Any]:
    """`usage.timings.pflash` fields of the passage signals the drafter computed."""
    keys = (
        "semantic_passages",
        "semantic_blocks",
        "semantic_ms",
        "semantic_reused",
        "semantic_prefetched",
        "projection_passages",
        "projection_ms",
    )
    return {k: scores.extras[k] for k in keys if k in scores.extras}


def _unit_sum(x: np.ndarray) -> np.ndarray:
    total = float(x.sum())
    return x / total if total > 0 else np.zeros_like(x)
