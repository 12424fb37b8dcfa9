"""Passage evidence in strict selection: passages that answer the question in other words.

Why: attention at the drafter's scoring layer does not connect a paraphrased question to its
evidence (BENCHMARKS.md, issue 18). Two signals can, both scored per passage of the text
before the question and mixed into the token scores:

- **likelihood** (`select_likelihood_weight`): the drafter as a language model; reading the
  passage that answers a question makes that question likelier, whatever words either uses
  (LongLLMLingua's coarse ranking; `pflash.models.drafter.likelihood`).
- **semantic** (`select_semantic_weight`): a sentence embedder trained to pair questions
  with the passages that answer them (`pflash.models.embedder`); cosine of question and
  passage.

Two pure steps around the drafter call:

1. `evidence_question` and `evidence_passages` (prepare): the question is the one the
   latest user turn closes with (`question_tail`: its last line or sentences, not the chat
   template after it), else the tail of the query span; the droppable text before it is cut
   into passages of at most `max_tokens` drafter tokens at sentence and line starts (the
   units of `pflash.compress.lexical.split_units`), so a fact is rarely split across two
   passages. Pinned spans are kept anyway and never scored.
2. `mix_evidence` (finish): per signal, each passage's score above the median passage's,
   spread over its tokens and normalised to sum 1 over the context, mixed with the attention
   scores (also normalised to sum 1 over the context):
   `score = (1 - sum w) * attention + sum_k w_k * signal_k`. Tokens from the question on keep
   their attention scores (they are mandatory).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pflash.compress.lexical import split_units
from pflash.compress.query import Plan, question_tail
from pflash.compress.scoring import ScoreRequest, ScoreResult
from pflash.config import PFlashConfig
from pflash.errors import CompressionFailed
from pflash.spans import Span, TokenizedText, subtract

QUESTION_TOKENS = 64  # longest question scored: its last line or sentences up to this


def evidence_question(plan: Plan) -> Span | None:
    """The question the passages are scored against (drafter tokens): the one
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


def evidence_passages(
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
    plan: Plan, pinned: Sequence[Span], config: PFlashConfig, *, suffix: bool
) -> dict[str, Any]:
    """What the drafter scores by question likelihood and by the sentence embedder, when
    asked for: passages of the droppable text before the question. Not in the agent loop
    (`suffix`): its candidates after the question have no passage, so the scores would not be
    on one scale. Returns the ScoreRequest fields."""
    want_likelihood = config.select_likelihood_weight > 0
    want_semantic = config.select_semantic_weight > 0
    if not (want_likelihood or want_semantic) or suffix:
        return {}
    question = evidence_question(plan)
    if question is None:
        return {}
    end = min(question.begin, plan.query.begin)
    out: dict[str, Any] = {}
    if want_likelihood:
        passages = evidence_passages(
            plan.drafter, end, pinned, max_tokens=config.likelihood_passage_tokens
        )
        if passages:
            out |= {"likelihood_passages": passages, "likelihood_question": question}
    if want_semantic:
        semantic = evidence_passages(
            plan.drafter, end, pinned, max_tokens=config.semantic_passage_tokens
        )
        if semantic:
            text = plan.drafter.text
            out |= {
                "semantic_passages": semantic,
                "semantic_texts": tuple(text[slice(*plan.drafter.char_span(p))] for p in semantic),
                "semantic_query": text[slice(*plan.drafter.char_span(question))],
            }
    return out


def passage_signals(
    req: ScoreRequest,
    scores: ScoreResult,
    config: PFlashConfig,
) -> list[PassageSignal]:
    """The passage scores asked for in prepare, checked: a missing, mis-sized or non-finite
    reply fails closed (stage drafter), never a selection without the asked signal."""
    asked = []
    if req.likelihood_passages:
        asked.append(
            (
                "likelihood",
                req.likelihood_passages,
                scores.likelihood,
                config.select_likelihood_weight,
            )
        )
    if req.semantic_texts:
        asked.append(
            ("semantic", req.semantic_passages, scores.semantic, config.select_semantic_weight)
        )
    out = []
    for name, passages, values, weight in asked:
        if values is None or np.shape(values) != (len(passages),):
            got = "none" if values is None else f"{np.shape(values)}"
            raise CompressionFailed(
                "drafter", f"{name} scores for {len(passages)} passages asked, {got} returned"
            )
        if not np.all(np.isfinite(values)):
            raise CompressionFailed("drafter", f"non-finite {name} scores")
        out.append(PassageSignal(tuple(passages), np.asarray(values), weight))
    return out


def evidence_stats(scores: ScoreResult) -> dict[str, Any]:
    """`usage.timings.pflash` fields of the passage signals the drafter computed."""
    keys = ("likelihood_passages", "likelihood_ms", "semantic_passages", "semantic_ms")
    return {k: scores.extras[k] for k in keys if k in scores.extras}


def _unit_sum(x: np.ndarray) -> np.ndarray:
    total = float(x.sum())
    return x / total if total > 0 else np.zeros_like(x)
