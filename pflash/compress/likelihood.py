"""Likelihood evidence in strict selection: passages that make the question more expected.

Why: attention at the drafter's scoring layer does not connect a paraphrased question to its
evidence (BENCHMARKS.md, issue 18). The drafter as a language model can: reading the
passage that answers a question makes that question likelier, whatever words either uses
(LongLLMLingua's coarse ranking). `select_likelihood_weight` > 0 asks the drafter for each
passage's gain (`pflash.models.drafter.likelihood`) and mixes it into the token scores.

Two pure steps around the drafter call:

1. `likelihood_question` and `likelihood_passages` (prepare): the question is the one the
   latest user turn closes with (`question_tail`: its last line or sentences, not the chat
   template after it), else the tail of the query span; the droppable text before it is cut into
   passages of at most `max_tokens` drafter tokens at sentence and line starts (the units
   of `pflash.compress.lexical.split_units`), so a fact is rarely split across two
   passages. Pinned spans are kept anyway and never scored.
2. `mix_likelihood` (finish): each passage's gain above the median passage's, spread over
   its tokens and normalised to sum 1 over the context, mixed with the attention scores
   (also normalised to sum 1 over the context) by `weight`:
   `score = (1 - weight) * attention + weight * likelihood`. Weight 1 ranks by likelihood
   alone. Tokens from the question on keep their attention scores (they are mandatory).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pflash.compress.lexical import split_units
from pflash.compress.query import Plan, question_tail
from pflash.spans import Span, TokenizedText, subtract

QUESTION_TOKENS = 64  # longest question scored: its last line or sentences up to this


def likelihood_question(plan: Plan) -> Span | None:
    """The question whose likelihood the passages are scored by (drafter tokens): the one
    closing the latest user turn when the query is the prompt's end (chat), else the last
    QUESTION_TOKENS of the query span (an explicit `pflash_query`, raw text). None when it has
    fewer than 2 tokens (the baseline needs one token of context)."""
    span = None
    if plan.query_rule == "prompt_end" and plan.content is not None:
        span = question_tail(plan.drafter, plan.drafter.char_span(plan.content), QUESTION_TOKENS)
    if span is None:
        qs = plan.query_span
        span = Span(max(qs.begin, qs.end - QUESTION_TOKENS), qs.end)
    return span if len(span) >= 2 else None


def likelihood_passages(
    drafter: TokenizedText, context_end: int, pinned: Sequence[Span], *, max_tokens: int
) -> tuple[Span, ...]:
    """Passages (drafter spans, source order, disjoint) tiling `[0, context_end)` minus the
    pinned spans, each at most `max_tokens` long, cut at sentence and line starts where
    possible."""
    out: list[Span] = []
    for region in subtract([Span(0, context_end)], pinned):
        if region.empty:
            continue
        c0, c1 = drafter.char_span(region)
        starts = sorted(
            {region.begin}
            | {
                t
                for b, _ in split_units(drafter.text, c0, c1, max_chars=None)
                if region.begin < (t := drafter.token_at_or_after(b)) < region.end
            }
        )
        out.extend(_group(starts + [region.end], max_tokens))
    return tuple(out)


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


def likelihood_token_scores(n: int, passages: Sequence[Span], gains: np.ndarray) -> np.ndarray:
    """Per-token likelihood evidence, float64 [n]: each passage's gain above the median
    passage's (0 when below), on each of its tokens; 0 outside the passages."""
    gains = np.asarray(gains, dtype=np.float64)
    if gains.shape != (len(passages),):
        raise ValueError(f"{gains.shape[0]} likelihood gains for {len(passages)} passages")
    out = np.zeros(n, dtype=np.float64)
    if not len(passages):
        return out
    above = np.maximum(gains - np.median(gains), 0.0)
    for span, g in zip(passages, above, strict=True):
        out[span.begin : span.end] = g
    return out


def mix_likelihood(
    token_scores: np.ndarray,
    passages: Sequence[Span],
    gains: np.ndarray,
    *,
    context_end: int,
    weight: float,
) -> np.ndarray:
    """`(1 - weight) * attention + weight * likelihood` over `[0, context_end)`, each part
    normalised to sum 1 there (a part that sums to 0 stays 0); tokens from `context_end` on
    keep `token_scores`. Returns float64 [n]."""
    scores = np.asarray(token_scores, dtype=np.float64)
    lik = likelihood_token_scores(scores.shape[0], passages, gains)
    out = scores.copy()
    ctx = slice(0, context_end)
    out[ctx] = (1.0 - weight) * _unit_sum(scores[ctx]) + weight * _unit_sum(lik[ctx])
    return out


def _unit_sum(x: np.ndarray) -> np.ndarray:
    total = float(x.sum())
    return x / total if total > 0 else np.zeros_like(x)
