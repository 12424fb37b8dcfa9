"""Candidates: the spans selection chooses from (drafter tokens, half-open), their scores and
which are mandatory; building them from a segmentation, splitting them at lexical-evidence
cut points, and promoting the evidence that fits the budget."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from pflash.compress.plan.segments import Segmentation, structurally_required
from pflash.spans import Span

SelectMode = Literal["budget_only", "top_p", "top_k"]
ScoreKind = Literal["sum", "density"]
StopReason = Literal[
    "top_p_reached",
    "top_k_reached",
    "budget_reached",
    "candidates_exhausted",
    "invalid_input",
    "mandatory_query_exceeds_budget",
]


# ----------------------------------------------------------------------------- candidates


@dataclass(frozen=True, eq=False)
class Candidates:
    """Candidate spans with scores, in drafter tokens.

    - `begin`, `end`: int64 [n]; `score`: float64 [n]; `mandatory`: bool [n];
      `ordinal`: int64 [n], the candidate's identity in results (default: its index).
    Built by `build_candidates` or `Candidates.of`; the selector validates them.
    """

    begin: np.ndarray
    end: np.ndarray
    score: np.ndarray
    mandatory: np.ndarray
    ordinal: np.ndarray

    @classmethod
    def of(
        cls,
        spans: Sequence[Span] | Sequence[tuple[int, int]],
        scores: Sequence[float] | np.ndarray,
        mandatory: Sequence[bool] | np.ndarray | None = None,
        ordinals: Sequence[int] | np.ndarray | None = None,
    ) -> Candidates:
        """Candidates from plain lists (spans as `Span` or (begin, end) pairs)."""
        pairs = [(s.begin, s.end) if isinstance(s, Span) else (int(s[0]), int(s[1])) for s in spans]
        n = len(pairs)
        be = np.asarray(pairs, dtype=np.int64).reshape(n, 2)
        return cls(
            begin=be[:, 0].copy(),
            end=be[:, 1].copy(),
            score=np.asarray(scores, dtype=np.float64).reshape(n),
            mandatory=np.zeros(n, bool) if mandatory is None else np.asarray(mandatory, bool),
            ordinal=np.arange(n, dtype=np.int64)
            if ordinals is None
            else np.asarray(ordinals, dtype=np.int64),
        )

    def __len__(self) -> int:
        return int(self.begin.size)

    @property
    def lengths(self) -> np.ndarray:
        return self.end - self.begin

    def spans(self) -> tuple[Span, ...]:
        return tuple(
            Span(b, e) for b, e in zip(self.begin.tolist(), self.end.tolist(), strict=True)
        )

    def replace(self, **changes: np.ndarray) -> Candidates:
        fields = {
            "begin": self.begin,
            "end": self.end,
            "score": self.score,
            "mandatory": self.mandatory,
            "ordinal": self.ordinal,
        }
        fields.update(changes)
        return Candidates(**fields)


def span_sums(values: np.ndarray, begin: np.ndarray, end: np.ndarray) -> np.ndarray:
    """float64 [n]: sum of `values` over each non-empty, non-overlapping `[begin, end)`.

    Summed in double over the float32 token scores (reference §11.2) with `np.add.reduceat`,
    so equal chunks of equal tokens get bit-identical sums (a cumsum difference would not, and
    rank ties must go to the lower ordinal).
    """
    v = np.concatenate((np.asarray(values, dtype=np.float64), [0.0]))
    n = int(begin.size)
    if n == 0:
        return np.zeros(0, dtype=np.float64)
    order = np.argsort(begin, kind="stable")
    edges = np.empty(2 * n, dtype=np.int64)
    edges[0::2] = begin[order]
    edges[1::2] = end[order]
    sums = np.empty(n, dtype=np.float64)
    sums[order] = np.add.reduceat(v, edges)[0::2]
    return sums


def resolve_score_kind(select_score: str, segments: str, scorer: str) -> ScoreKind:
    """How a candidate's score is formed (reference §4.4, §4.3 PFLASH_SELECT_SCORE).

    The legacy scorer always ranks by mean (its scores are not masses). For the head scorer an
    explicit `sum`/`density` wins; `auto` is sum of mass on fixed chunks (a full chunk beats a
    short tail) and density on probe segments (segments differ in length by design).
    """
    if scorer == "legacy":
        return "density"
    if select_score in ("sum", "density"):
        return select_score  # type: ignore[return-value]
    if select_score != "auto":
        raise ValueError(f"score must be auto, sum or density, got {select_score!r}")
    return "density" if segments == "probe" else "sum"


def build_candidates(
    segments: Segmentation | tuple[np.ndarray, np.ndarray],
    token_scores: np.ndarray,
    *,
    query: Span,
    pinned: Sequence[Span],
    suffix_candidates: bool,
    kind: ScoreKind,
) -> Candidates:
    """Score candidate spans and flag the structurally required ones (reference §4.4).

    `token_scores`: float [S] per drafter token (head mass or legacy smoothed score). A
    candidate's score is the span sum (`kind="sum"`) or its mean (`"density"`). Mandatory: it
    overlaps the query window or a pinned span, or ends after the query unless
    `suffix_candidates`.
    """
    if isinstance(segments, Segmentation):
        begin, end = segments.begin, segments.end
    else:
        begin, end = (np.asarray(a, dtype=np.int64) for a in segments)
    sums = span_sums(token_scores, begin, end)
    score = sums / (end - begin) if kind == "density" else sums
    mandatory = structurally_required(
        begin, end, query=query, pinned=pinned, suffix_candidates=suffix_candidates
    )
    return Candidates(begin, end, score, mandatory, np.arange(begin.size, dtype=np.int64))


def split_candidates(
    cands: Candidates,
    cuts: Sequence[int],
    token_scores: np.ndarray,
    *,
    kind: ScoreKind,
    min_piece: int = 1,
) -> Candidates:
    """Cut the optional candidates at the drafter-token positions `cuts`.

    Why: a lexical anchor is one sentence; promoting it must not cost its whole 64-token
    chunk or probe segment. Mandatory candidates are never cut (a piece of the query chunk
    could otherwise turn optional). A piece of an optional candidate is optional too (it
    overlaps nothing its parent did not), and is scored like the parent (`kind`) over its own
    span. Ordinals are renumbered in source order. Without a cut inside an optional
    candidate, `cands` is returned as is.

    `min_piece`: a cut closer than this many tokens to its candidate's edge or to the cut
    before it is skipped. Why: passage bounds sit at sentence starts and segment bounds
    elsewhere, so their slivers (a line's indentation, a blank line) would each be a
    candidate at their passage's density and fill the budget's leftovers with whitespace.
    """
    points = np.unique(np.asarray(cuts, dtype=np.int64))
    lo = np.searchsorted(points, cands.begin, side="right")
    hi = np.searchsorted(points, cands.end, side="left")
    split = (hi > lo) & ~cands.mandatory
    if not split.any():
        return cands
    begins: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    mandatory: list[np.ndarray] = []
    for i in np.argsort(cands.begin, kind="stable").tolist():
        inner = points[lo[i] : hi[i]] if split[i] else points[:0]
        if min_piece > 1 and inner.size:
            inner = _spaced(inner, int(cands.begin[i]), int(cands.end[i]), min_piece)
        edges = np.concatenate(([cands.begin[i]], inner, [cands.end[i]]))
        begins.append(edges[:-1])
        ends.append(edges[1:])
        mandatory.append(np.full(edges.size - 1, bool(cands.mandatory[i])))
    begin, end = np.concatenate(begins), np.concatenate(ends)
    sums = span_sums(token_scores, begin, end)
    score = sums / (end - begin) if kind == "density" else sums
    return Candidates(
        begin, end, score, np.concatenate(mandatory), np.arange(begin.size, dtype=np.int64)
    )


def _spaced(inner: np.ndarray, begin: int, end: int, gap: int) -> np.ndarray:
    """The cuts of `inner` (sorted, inside (begin, end)) at least `gap` tokens from `end`
    and from the last cut kept (`begin` first)."""
    kept, last = [], begin
    for c in inner.tolist():
        if c - last >= gap and end - c >= gap:
            kept.append(c)
            last = c
    return np.asarray(kept, dtype=np.int64)


def promote_spans(
    cands: Candidates, spans: Sequence[Span], *, budget: int, share: float = 1.0
) -> tuple[Candidates, int]:
    """Mark as mandatory the optional candidates overlapping each span, in the given order.

    Why: lexical evidence (the question, text sharing its rare words) must be kept before
    attention fills the rest, but never at the cost of the budget. The allowance is
    floor(`share` x (`budget` - mandatory tokens)) drafter tokens; a span whose candidates do
    not fit what is left is skipped for the next one. Returns the new candidates and how many
    spans were promoted (spans already fully kept cost nothing and are not counted).
    """
    lengths = cands.lengths
    mandatory = cands.mandatory.copy()
    left = math.floor(share * (budget - int(lengths[mandatory].sum())))
    if left <= 0 or not spans:
        return cands, 0
    order = np.argsort(cands.begin, kind="stable")
    begin, end = cands.begin[order], cands.end[order]
    promoted = 0
    for s in spans:
        a = int(np.searchsorted(end, s.begin, side="right"))
        b = int(np.searchsorted(begin, s.end, side="left"))
        idx = order[a:b]
        idx = idx[~mandatory[idx]]
        cost = int(lengths[idx].sum())
        if cost == 0 or cost > left:
            continue
        mandatory[idx] = True
        left -= cost
        promoted += 1
    if not promoted:
        return cands, 0
    return cands.replace(mandatory=mandatory), promoted
