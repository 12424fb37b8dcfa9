"""The scorer contract: what the pipeline asks a drafter for and what it gets back.

A scorer is any callable `ScoreRequest -> ScoreResult`. The real one is the drafter
(`pflash/models/drafter/scorer.py`, run in the DrafterScorer deployment); unit tests pass
deterministic ones. Token indices are drafter tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from pflash.compress.plan.query import QueryWindow
from pflash.spans import Span


@dataclass(frozen=True)
class ScoreRequest:
    """Score `ids` for the given query windows.

    - `query`: the main window; keys in it are never visible (it does not score itself).
    - `suffix_candidates`: keys after `query.end` are visible too (agent loop, §3.3).
    - `scorer`: "head" (attention mass), "legacy" (tail running max + pooling) or "split".
    - `session_key`: conversation key for drafter session reuse (None = score from scratch).
    - `want_tap`: also return the hidden states at the probe tap (for the segment probe).
    - `semantic_texts`: passage texts to score by the sentence embedder's cosine to each of
      `semantic_questions` (the question, then each of its sentences when it has several;
      `pflash.compress.evidence.passage_evidence`); empty = none asked. `semantic_passages`: their spans, for the
      pipeline that mixes the scores (the drafter reads the texts).
    - `projection_passages`: passages to score by the tap projection's cosine to the
      `projection_question` rows (`pflash.models.projection`); empty = none asked.
    - `evidence_blocks`: code blocks the sentence embedder also reads whole
      (`pflash.compress.evidence.code_blocks`): their texts follow the passages' in `semantic_texts`.
    - `semantic_prefetch`: passage texts after the question (an agent's tool outputs since
      the user last spoke) to embed into the conversation's memo and not score: the next
      question reads them as passages, and then pays only for its own (§6.4).
    - `read_ahead`: a background pass after a verbatim append (the compressor's read-ahead),
      whose result nobody reads: the drafter skips it (`skipped_read_ahead`) when the
      conversation's session already covers a longer prompt, which the pass would rewind.
    """

    ids: tuple[int, ...]
    windows: tuple[QueryWindow, ...]
    query: Span
    suffix_candidates: bool = False
    scorer: str = "head"
    session_key: str | None = None
    want_tap: bool = False
    semantic_passages: tuple[Span, ...] = ()
    semantic_texts: tuple[str, ...] = ()
    semantic_questions: tuple[str, ...] = ()
    semantic_prefetch: tuple[str, ...] = ()
    projection_passages: tuple[Span, ...] = ()
    projection_question: Span | None = None
    evidence_blocks: tuple[Span, ...] = ()
    read_ahead: bool = False


@dataclass(frozen=True)
class ScoreResult:
    """Per-token scores over all S drafter tokens.

    - `mass`: head scorer attention mass, float32 [S]; sums to 1 over visible keys and is 0
      on masked keys. None when only the legacy scorer ran.
    - `legacy`: legacy smoothed running-max scores, float32 [S] (legacy and split scorers).
    - `tap`: hidden states entering the scoring layer, float32 [S, hidden] (when asked).
    - `semantic`: per question and asked text, the cosine of their embeddings, float32
      [len(semantic_questions), len(semantic_texts)] (passages, then evidence blocks); None
      when none was asked.
    - `projection`: per asked projection passage, the tap projection's cosine to the
      question, float32 [len(projection_passages)]; None when none was asked.
    - `scorer_resume`: tokens reused from a drafter session; `scorer_new_tokens`: tokens
      run through the drafter this call; `scorer_forward_ms`: drafter forward wall time.
    - `tap_id`: names this tap when a drafter session keeps it (else None); `tap_parent`:
      the `tap_id` of the tap whose first `scorer_resume` rows this one reuses, None when it
      reuses none. The probe keeps its per-row logits by these (`SegmentProbe.memo`).
    """

    mass: np.ndarray | None
    legacy: np.ndarray | None = None
    tap: np.ndarray | None = None
    scorer_resume: int = 0
    scorer_new_tokens: int = 0
    scorer_forward_ms: float = 0.0
    extras: dict = field(default_factory=dict)
    semantic: np.ndarray | None = None
    projection: np.ndarray | None = None
    tap_id: str | None = None
    tap_parent: str | None = None


Scorer = Callable[[ScoreRequest], ScoreResult]


def candidate_lifts(mass: np.ndarray, spans: Sequence[Span]) -> list[tuple[Span, float]]:
    """Lift of each candidate: its mean per-token mass relative to uniform (1/S), §3.5.

    lift = (sum of mass over the span / span length) * S; 1 means uniform attention.
    """
    s = int(mass.shape[0])
    csum = np.concatenate(([0.0], np.cumsum(mass, dtype=np.float64)))
    out = []
    for sp in spans:
        n = len(sp)
        out.append((sp, float((csum[sp.end] - csum[sp.begin]) / n * s) if n else 0.0))
    return out


def skipped_read_ahead() -> ScoreResult:
    """What the drafter answers a read-ahead it skipped (`ScoreRequest.read_ahead`)."""
    return ScoreResult(mass=None, extras={"read_ahead": "skipped"})


def is_skipped_read_ahead(result: ScoreResult) -> bool:
    return result.extras.get("read_ahead") == "skipped"
