"""Which candidate spans survive compression: the strict, split and legacy selectors.

All spans are half-open `[begin, end)` in **drafter tokens**. Pure functions over numpy arrays;
nothing here loops per token.

- Strict (reference ALGORITHM.md §4.4-§4.5): mandatory candidates are charged to the token
  budget first (failing closed when they alone exceed it); optional candidates are ranked by
  max(0, score), ties to the lower ordinal, and added until the budget, top_p mass or top_k
  count stops the fill. Fixed chunks never skip ahead to a smaller candidate; probe segments
  may (`skip_oversized`).
- Lexical evidence (issue 10): `split_candidates` gives each anchored sentence its own
  candidate, `promote_spans` makes the ones that fit the budget mandatory before the fill.
- Split (§4.6): the head scorer fills its share of the budget, the legacy scorer the rest.
- Legacy (§4.1): fixed 32-token chunks, head/tail forcing, 4-gram lexical anchors, the
  optional Qwen3.5 repeat-token rule, then fill by chunk mean up to n_keep chunks.
- Assembly overhead (§4.9): extra tokens written at assembly are paid inside the budget by
  dropping the lowest-ranked selected optional candidates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from pflash.compress.segments import Segmentation, structurally_required
from pflash.spans import Span, canonicalize

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
    cands: Candidates, cuts: Sequence[int], token_scores: np.ndarray, *, kind: ScoreKind
) -> Candidates:
    """Cut the optional candidates at the drafter-token positions `cuts`.

    Why: a lexical anchor is one sentence; promoting it must not cost its whole 64-token
    chunk or probe segment. Mandatory candidates are never cut (a piece of the query chunk
    could otherwise turn optional). A piece of an optional candidate is optional too (it
    overlaps nothing its parent did not), and is scored like the parent (`kind`) over its own
    span. Ordinals are renumbered in source order. Without a cut inside an optional
    candidate, `cands` is returned as is.
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


# ----------------------------------------------------------------------------- strict selector


@dataclass(frozen=True)
class SelectionResult:
    """What a selector kept.

    - `ok`: False on invalid input or when the mandatory candidates alone exceed the budget;
      then `ordinals` is empty, `retained_tokens` 0 and `error` says why.
    - `ordinals`: kept candidates' ordinals in source order (by span begin).
    - `retained_tokens`: drafter tokens kept, mandatory included.
    - `retained_mass`: normalised score mass of the kept **optional** candidates, in [0, 1].
    - `stop_reason`: why the fill stopped.
    """

    ok: bool
    ordinals: tuple[int, ...]
    retained_tokens: int
    retained_mass: float
    stop_reason: StopReason
    error: str | None = None


def _invalid(error: str) -> SelectionResult:
    return SelectionResult(False, (), 0, 0.0, "invalid_input", error)


def validate_candidates(
    cands: Candidates, *, budget: int, mode: str, top_p: float, top_k: int
) -> str | None:
    """None when the selector may run, else the reason (reference §4.5 validation)."""
    if mode == "legacy":
        return "legacy mode does not use strict selection"
    if mode not in ("budget_only", "top_p", "top_k"):
        return f"unknown selection mode {mode!r}"
    if budget <= 0:
        return f"token budget must be positive, got {budget}"
    if not (math.isfinite(top_p) and 0.0 < top_p <= 1.0):
        return f"top_p must be finite and in (0, 1], got {top_p}"
    if mode == "top_k" and top_k <= 0:
        return f"top_k must be positive in top_k mode, got {top_k}"
    n = len(cands)
    if not (cands.end.size == cands.score.size == cands.mandatory.size == cands.ordinal.size == n):
        return "candidate arrays differ in length"
    if n == 0:
        return None
    if np.any(cands.begin < 0) or np.any(cands.end <= cands.begin):
        return "candidate range is invalid (needs 0 <= begin < end)"
    if not np.all(np.isfinite(cands.score)):
        return "candidate score must be finite"
    if np.unique(cands.ordinal).size != n:
        return "candidate ordinals must be unique"
    order = np.lexsort((cands.end, cands.begin))
    if np.any(cands.end[order][:-1] > cands.begin[order][1:]):
        return "candidate ranges must not overlap"
    return None


def select_candidates(
    cands: Candidates,
    *,
    budget: int,
    mode: str = "budget_only",
    top_p: float = 0.95,
    top_k: int = 0,
    skip_oversized: bool = False,
) -> SelectionResult:
    """Strict selection of candidates under a drafter-token `budget` (reference §4.5).

    1. Mandatory candidates, in input order, are charged first; if one does not fit, the
       result is `mandatory_query_exceeds_budget` (fail closed, nothing kept).
    2. Optional candidates are ranked by max(0, score) descending, ordinal ascending. Each has
       a mass share s / sum(s) over the optional ones (1/n each when no score is positive).
    3. Fill in rank order: top_p stops once the retained mass is >= top_p (checked before
       adding, so the crossing candidate is in); top_k after K optional candidates; a
       candidate longer than the remaining budget stops the fill (`budget_reached`), or with
       `skip_oversized` (probe segments only) is skipped for the next one.
    Runs vectorised over the ranked list; only the `skip_oversized` tail after the first
    budget miss walks candidates one by one.
    """
    err = validate_candidates(cands, budget=budget, mode=mode, top_p=top_p, top_k=top_k)
    if err is not None:
        return _invalid(err)

    lengths = cands.lengths
    mand = np.flatnonzero(cands.mandatory)
    mand_cum = np.cumsum(lengths[mand])
    if mand_cum.size and mand_cum[-1] > budget:
        return SelectionResult(
            False,
            (),
            0,
            0.0,
            "mandatory_query_exceeds_budget",
            f"mandatory tokens {int(mand_cum[-1])} exceed the token budget {budget}",
        )
    retained = int(mand_cum[-1]) if mand_cum.size else 0

    opt = np.flatnonzero(~cands.mandatory)
    pos = np.maximum(cands.score[opt], 0.0)
    rank = np.lexsort((cands.ordinal[opt], -pos))
    opt, pos = opt[rank], pos[rank]
    n_opt = int(opt.size)
    top = float(pos.max()) if n_opt else 0.0
    if top > 0.0:
        scaled = pos / top
        share = scaled / float(np.cumsum(scaled)[-1])
    else:
        share = np.full(n_opt, 1.0 / n_opt if n_opt else 0.0)

    remaining = budget - retained
    opt_len = lengths[opt]
    cum_len = np.cumsum(opt_len)
    cum_mass = np.cumsum(share)
    mass_before = np.concatenate(([0.0], cum_mass[:-1])) if n_opt else cum_mass
    never = n_opt
    first_p = (
        int(np.argmax(mass_before >= top_p))
        if mode == "top_p" and n_opt and mass_before[-1] >= top_p
        else never
    )
    first_k = min(top_k, never) if mode == "top_k" else never
    first_b = int(np.argmax(cum_len > remaining)) if n_opt and cum_len[-1] > remaining else never
    stop_at = min(first_p, first_k, first_b)

    taken = list(opt[:stop_at])
    mass = float(cum_mass[stop_at - 1]) if stop_at else 0.0
    retained += int(cum_len[stop_at - 1]) if stop_at else 0
    stop: StopReason
    if stop_at == never:
        stop = "candidates_exhausted"
    elif stop_at == first_p:
        stop = "top_p_reached"
    elif stop_at == first_k:
        stop = "top_k_reached"
    else:
        stop = "budget_reached"
        if skip_oversized:
            stop, retained, mass = _fill_skipping(
                opt, opt_len, share, stop_at, retained, mass, budget, mode, top_p, top_k, taken
            )

    chosen = np.concatenate((mand, np.asarray(taken, dtype=np.int64)))
    chosen = chosen[np.lexsort((cands.end[chosen], cands.begin[chosen]))]
    return SelectionResult(True, tuple(int(o) for o in cands.ordinal[chosen]), retained, mass, stop)


def _fill_skipping(
    opt: np.ndarray,
    opt_len: np.ndarray,
    share: np.ndarray,
    start: int,
    retained: int,
    mass: float,
    budget: int,
    mode: str,
    top_p: float,
    top_k: int,
    taken: list[int],
) -> tuple[StopReason, int, float]:
    """The rest of the fill after the first budget miss when oversized candidates are skipped.

    Only candidates no longer than the budget left at the miss can ever fit (the budget only
    shrinks), so those alone are walked; a top_p/top_k stop needs a next candidate to trigger.
    Appends to `taken`; returns (stop, retained, mass).
    """
    stop: StopReason = "budget_reached"
    kept = len(taken)
    n = int(opt.size)
    for j in np.flatnonzero(opt_len[start:] <= budget - retained) + start:
        length = int(opt_len[j])
        if length > budget - retained:
            continue
        taken.append(int(opt[j]))
        retained += length
        kept += 1
        mass += float(share[j])
        if j + 1 < n:
            if mode == "top_p" and mass >= top_p:
                return "top_p_reached", retained, mass
            if mode == "top_k" and kept >= top_k:
                return "top_k_reached", retained, mass
    return stop, retained, mass


def select_split(
    head: Candidates,
    other_scores: np.ndarray,
    *,
    budget: int,
    fraction: float,
    mode: str = "budget_only",
    top_p: float = 0.95,
    top_k: int = 0,
    skip_oversized: bool = False,
) -> SelectionResult:
    """Two-scorer selection (reference §4.6): the head scorer spends its share, the legacy
    scorer the rest.

    `head`: candidates with head scores and mandatory flags; `other_scores`: float [n], the
    same spans scored by the legacy scorer (mean of its smoothed per-token scores). Pass 1
    selects from `head` with budget max(floor(B f), min(mandatory tokens, B)); pass 2 selects
    from the candidates pass 1 left, mandatory flags cleared, under the legacy scores and the
    budget left, if any. Result: both passes' ordinals in source order, pass-1 mass, pass-2
    stop when it ran. top_k is refused: a per-pass K would keep up to 2K candidates.
    """
    if mode == "top_k":
        return _invalid("split selection does not support top_k")
    other = np.asarray(other_scores, dtype=np.float64)
    if other.shape != head.score.shape or not (0.0 < fraction < 1.0):
        return _invalid(
            "split selection needs one legacy score per candidate and a fraction in (0, 1)"
        )
    mandatory_tokens = int(head.lengths[head.mandatory].sum())
    first_budget = max(int(budget * fraction), min(mandatory_tokens, budget))
    pass1 = select_candidates(
        head, budget=first_budget, mode=mode, top_p=top_p, skip_oversized=skip_oversized
    )
    if not pass1.ok:
        return pass1
    left = budget - pass1.retained_tokens
    ordinals = list(pass1.ordinals)
    stop = pass1.stop_reason
    retained = pass1.retained_tokens
    if left > 0:
        rest = ~np.isin(head.ordinal, np.asarray(pass1.ordinals, dtype=np.int64))
        second = Candidates(
            head.begin[rest],
            head.end[rest],
            other[rest],
            np.zeros(int(rest.sum()), dtype=bool),
            head.ordinal[rest],
        )
        pass2 = select_candidates(
            second, budget=left, mode=mode, top_p=top_p, skip_oversized=skip_oversized
        )
        if not pass2.ok:
            return pass2
        ordinals.extend(pass2.ordinals)
        stop = pass2.stop_reason
        retained += pass2.retained_tokens
    return SelectionResult(True, _source_order(head, ordinals), retained, pass1.retained_mass, stop)


def _source_order(cands: Candidates, ordinals: Sequence[int]) -> tuple[int, ...]:
    idx = _indices_of(cands, ordinals)
    idx = idx[np.argsort(cands.begin[idx], kind="stable")]
    return tuple(int(o) for o in cands.ordinal[idx])


def _indices_of(cands: Candidates, ordinals: Sequence[int]) -> np.ndarray:
    """Positions of `ordinals` in `cands` (every ordinal must be present)."""
    want = np.asarray(ordinals, dtype=np.int64)
    order = np.argsort(cands.ordinal, kind="stable")
    pos = np.searchsorted(cands.ordinal[order], want)
    idx = order[np.minimum(pos, max(0, order.size - 1))] if order.size else pos
    if want.size and (order.size == 0 or np.any(cands.ordinal[idx] != want)):
        raise ValueError("ordinal not among the candidates")
    return idx


def merge_runs(begin: np.ndarray, end: np.ndarray) -> tuple[Span, ...]:
    """Kept spans: the given spans sorted and merged where adjacent (or overlapping)."""
    return canonicalize(Span(b, e) for b, e in zip(begin.tolist(), end.tolist(), strict=True))


def kept_spans(cands: Candidates, ordinals: Sequence[int]) -> tuple[Span, ...]:
    """The drafter-token runs a selection keeps, merged where candidates touch (§4.8)."""
    idx = _indices_of(cands, ordinals)
    return merge_runs(cands.begin[idx], cands.end[idx])


# ----------------------------------------------------------------------------- assembly overhead


@dataclass(frozen=True)
class AssemblyFit:
    """A selection after paying assembly extras inside the budget (reference §4.9).

    - `ordinals`: candidates still kept, source order; `dropped`: optional ones given up, in
      drop order.
    - `kept`: merged runs incl. added container headers (drafter tokens).
    - `header_tokens`: header tokens not already inside a kept candidate; `cut_markers`:
      markers written between runs; `retained_tokens`: kept tokens + markers x marker tokens.
    """

    ordinals: tuple[int, ...]
    dropped: tuple[int, ...]
    kept: tuple[Span, ...]
    header_tokens: int
    cut_markers: int
    retained_tokens: int


def fit_assembly_overhead(
    cands: Candidates,
    ordinals: Sequence[int],
    *,
    budget: int,
    marker_tokens: int = 0,
    container_extents: Sequence[Span] = (),
    container_headers: Sequence[Span] = (),
) -> AssemblyFit:
    """Pay the assembly experiments' extra tokens inside the drafter-token `budget`.

    Both experiments are off by default (`select_container_headers`, `assembly_cut_marker`);
    with them off (no containers, `marker_tokens` 0) the selection is returned unchanged.
    Otherwise a container header is added for every container holding a kept optional
    candidate, and `marker_tokens` per gap between kept runs; while the total exceeds the
    budget, the lowest-ranked kept optional candidate (lowest max(0, score), higher ordinal
    first) is dropped and the total recomputed - one at a time, since a drop may also free a
    header or a marker. Mandatory candidates are never dropped.
    """
    if len(container_extents) != len(container_headers):
        raise ValueError("container extents and headers differ in length")
    idx = _indices_of(cands, ordinals)
    idx = idx[np.argsort(cands.begin[idx], kind="stable")]
    optional = idx[~cands.mandatory[idx]]
    drop_order = optional[
        np.lexsort((-cands.ordinal[optional], np.maximum(cands.score[optional], 0.0)))
    ]
    ext_b = np.asarray([s.begin for s in container_extents], dtype=np.int64)
    ext_e = np.asarray([s.end for s in container_extents], dtype=np.int64)
    alive = np.ones(idx.size, dtype=bool)
    position = {int(i): k for k, i in enumerate(idx.tolist())}
    dropped: list[int] = []
    next_drop = 0
    while True:
        live = idx[alive]
        segments = merge_runs(cands.begin[live], cands.end[live])
        headers: list[Span] = []
        if ext_b.size:
            content = live[~cands.mandatory[live]]
            # container c holds candidate i when they overlap
            hold = (ext_b[:, None] < cands.end[content][None, :]) & (
                ext_e[:, None] > cands.begin[content][None, :]
            )
            headers = [container_headers[c] for c in np.flatnonzero(hold.any(axis=1))]
        kept = canonicalize([*segments, *headers])
        kept_tokens = sum(len(s) for s in kept)
        markers = len(kept) - 1 if marker_tokens > 0 and kept else 0
        total = kept_tokens + markers * marker_tokens
        if total <= budget or next_drop >= drop_order.size:
            return AssemblyFit(
                ordinals=tuple(int(o) for o in cands.ordinal[live]),
                dropped=tuple(dropped),
                kept=kept,
                header_tokens=kept_tokens - sum(len(s) for s in segments),
                cut_markers=markers,
                retained_tokens=total,
            )
        victim = int(drop_order[next_drop])
        next_drop += 1
        alive[position[victim]] = False
        dropped.append(int(cands.ordinal[victim]))


# ----------------------------------------------------------------------------- legacy selector


@dataclass(frozen=True)
class LegacyParams:
    """Legacy selector knobs (reference §4.1). Chunk counts are in chunks, the rest in drafter
    tokens.

    `anchor_radius` / `anchor_max_hits`: None = by length tier; 0 is a valid override.
    `repeat_rule`: the Qwen3.5 legacy repeat-token rule (off for Qwen3-0.6B); `repeat_limit`
    None = n_keep.
    """

    chunk_size: int = 32
    head_chunks: int = 8
    tail_chunks: int = 24
    query_tokens: int = 96
    anchor_radius: int | None = None
    anchor_max_hits: int | None = None
    repeat_rule: bool = False
    repeat_min: int = 4
    repeat_max: int = 32
    repeat_limit: int | None = None

    @classmethod
    def from_config(cls, config, *, repeat_rule: bool = False) -> LegacyParams:
        """From a PFlashConfig; `repeat_rule` is the drafter profile's choice (Qwen3.5)."""
        return cls(
            chunk_size=config.legacy_chunk_size,
            head_chunks=config.legacy_head_chunks,
            tail_chunks=config.legacy_tail_chunks,
            query_tokens=config.anchor_query_tokens,
            anchor_radius=config.anchor_radius,
            anchor_max_hits=config.anchor_max_hits,
            repeat_rule=repeat_rule,
            repeat_min=config.repeat_min,
            repeat_max=config.repeat_max,
        )


@dataclass(frozen=True)
class LegacySelection:
    """Legacy selector output: `chunks` (ascending chunk indices), the `kept` merged drafter-
    token runs, `n_keep`/`n_chunks`, and how many chunks were forced before the fill
    (`forced`, which may exceed n_keep: anchors are not capped)."""

    chunks: tuple[int, ...]
    kept: tuple[Span, ...]
    n_keep: int
    n_chunks: int
    forced: int

    @property
    def retained_tokens(self) -> int:
        return sum(len(s) for s in self.kept)


def legacy_smooth(scores: np.ndarray, width: int = 13) -> np.ndarray:
    """In-range mean pooling (reference §3.1 step 6): smooth[j] = mean of scores over
    [j - w//2, j + w//2] ∩ [0, S), dividing by the count of in-range elements (no zero
    padding). float [S] -> float32 [S]."""
    x = np.asarray(scores, dtype=np.float64)
    s = x.size
    half = width // 2
    csum = np.concatenate(([0.0], np.cumsum(x)))
    # window [j - half, j + half] clipped to [0, S): sums and counts by slicing, no gathers
    padded = np.concatenate((np.zeros(half), csum, np.full(half, csum[-1])))
    sums = padded[2 * half + 1 : 2 * half + 1 + s] - padded[:s]
    j = np.arange(s)
    counts = np.minimum(s, j + half + 1) - np.maximum(0, j - half)
    return (sums / counts).astype(np.float32)


def legacy_n_keep(n_chunks: int, keep_ratio: float) -> int:
    """max(1, floor(n_chunks * keep)), the product in float32 as the reference computes it."""
    return max(1, int(np.float32(n_chunks) * np.float32(keep_ratio)))


def head_tail_counts(n_keep: int, head: int, tail: int) -> tuple[int, int]:
    """Forced head/tail chunk counts, scaled down so they leave the fill at least one slot.

    If head + tail >= n_keep: B = max(1, n_keep - 1), head' = floor(head B / (head + tail)),
    tail' = B - head' (n_keep 100 -> 8/24; n_keep 20 -> 4/15).
    """
    if head + tail >= n_keep:
        b = max(1, n_keep - 1)
        h = max(0, head * b // (head + tail)) if head + tail else 0
        return h, max(0, b - h)
    return head, tail


def anchor_tier(n_chunks: int) -> tuple[int, int]:
    """(radius, max_hits) by chunk count: < 1024 -> (2, 8); < 2048 -> (4, 16); else (8, 32)."""
    if n_chunks < 1024:
        return 2, 8
    if n_chunks < 2048:
        return 4, 16
    return 8, 32


def _gram_keys(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every 4-gram start p: an exact key pair (k1, k2) and a mixing hash, uint64 [S-3]."""
    u = ids.astype(np.uint64)
    k1 = (u[:-3] << np.uint64(32)) | u[1:-2]
    k2 = (u[2:-1] << np.uint64(32)) | u[3:]
    return k1, k2, (k1 * np.uint64(0x9E3779B97F4A7C15)) ^ k2


def anchor_chunks(
    ids: np.ndarray, n_chunks: int, chunk_size: int, query_tokens: int, radius: int, max_hits: int
) -> np.ndarray:
    """bool [n_chunks]: chunks forced by 4-gram lexical anchors (reference §4.1 step 3).

    Every 4-gram of the query pool (the last `query_tokens` tokens, from q0 = max(0, S - pool))
    is looked up among the body starts p in [0, max(0, q0 - 4)]. A query 4-gram with 1 to
    `max_hits` body matches forces chunk floor(p / C) +- `radius` (clamped) for each match; more
    matches mean a common phrase, not a key, and force nothing. Why: retrieval questions
    repeat a rare key that also appears next to the answer.
    """
    ids = np.asarray(ids, dtype=np.int64)
    s = ids.size
    forced = np.zeros(n_chunks, dtype=bool)
    if s < 4 or max_hits <= 0 or n_chunks == 0:
        return forced
    q0 = max(0, s - query_tokens)
    if q0 > s - 4:
        return forced  # the pool is shorter than one 4-gram
    body_last = max(0, q0 - 4)  # inclusive; the reference scans p = 0 even when q0 < 4
    k1, k2, h = _gram_keys(ids)
    qh, first = np.unique(h[q0:], return_index=True)
    qk1, qk2 = k1[q0:][first], k2[q0:][first]
    bh = h[: body_last + 1]
    at = np.minimum(np.searchsorted(qh, bh), qh.size - 1)
    hit = np.flatnonzero(qh[at] == bh)
    g = at[hit]
    exact = (qk1[g] == k1[hit]) & (qk2[g] == k2[hit])
    hit, g = hit[exact], g[exact]
    # distinct query grams sharing a hash (astronomically rare) fall back to exact pairs
    if np.unique(np.stack((qk1, qk2)), axis=1).shape[1] != qh.size:  # pragma: no cover
        return _anchor_chunks_exact(ids, n_chunks, chunk_size, q0, body_last, radius, max_hits)
    counts = np.bincount(g, minlength=qh.size)
    hit = hit[counts[g] <= max_hits]
    return _force_neighbourhoods(forced, hit // chunk_size, radius)


def _anchor_chunks_exact(ids, n_chunks, chunk_size, q0, body_last, radius, max_hits):
    grams = np.lib.stride_tricks.sliding_window_view(ids, 4)
    body = {}
    for p in range(body_last + 1):
        body.setdefault(tuple(grams[p]), []).append(p)
    hits = [
        p
        for q in {tuple(g) for g in grams[q0:]}
        for p in body.get(q, ())
        if len(body[q]) <= max_hits
    ]
    return _force_neighbourhoods(
        np.zeros(n_chunks, dtype=bool), np.asarray(hits, dtype=np.int64) // chunk_size, radius
    )


def _force_neighbourhoods(forced: np.ndarray, chunks: np.ndarray, radius: int) -> np.ndarray:
    """Mark chunk c +- radius (clamped) for every c in `chunks`, via a difference array."""
    n = forced.size
    if chunks.size == 0:
        return forced
    lo = np.clip(chunks - radius, 0, n - 1)
    hi = np.clip(chunks + radius, 0, n - 1)
    diff = np.zeros(n + 1, dtype=np.int64)
    np.add.at(diff, lo, 1)
    np.add.at(diff, hi + 1, -1)
    return forced | (np.cumsum(diff[:n]) > 0)


def repeat_token_chunks(
    ids: np.ndarray,
    selected: np.ndarray,
    chunk_size: int,
    query_tokens: int,
    repeat_min: int,
    repeat_max: int,
    limit: int,
) -> np.ndarray:
    """Chunks added by the Qwen3.5 legacy repeat-token rule (reference §4.1 step 4).

    Tokens occurring `repeat_min`..`repeat_max` times in the body [0, S - query_tokens) are
    taken by descending frequency, then ascending id; the chunk of each occurrence (in
    position order) is selected until `limit` chunks are selected. Why: aggregation questions
    depend on repeated rare tokens that the question itself does not contain.
    Returns the new selection mask (a copy).
    """
    out = selected.copy()
    count = int(out.sum())
    if repeat_min <= 1 or count >= limit:
        return out
    body = np.asarray(ids, dtype=np.int64)[: max(0, ids.size - query_tokens)]
    if body.size == 0:
        return out
    tokens, freq = np.unique(body, return_counts=True)
    pick = (freq >= repeat_min) & (freq <= repeat_max)
    tokens, freq = tokens[pick], freq[pick]
    if tokens.size == 0:
        return out
    order = np.lexsort((tokens, -freq))
    rank = np.full(int(tokens.max()) + 1 - int(tokens.min()), -1, dtype=np.int64)
    rank[tokens[order] - tokens.min()] = np.arange(order.size)
    in_range = (body >= tokens.min()) & (body <= tokens.max())
    r = np.full(body.size, -1, dtype=np.int64)
    r[in_range] = rank[body[in_range] - tokens.min()]
    positions = np.flatnonzero(r >= 0)
    visit = positions[np.lexsort((positions, r[positions]))]
    chunks = visit // chunk_size
    chunks = chunks[~out[chunks]]
    uniq, first = np.unique(chunks, return_index=True)
    new = uniq[np.argsort(first, kind="stable")][: limit - count]
    out[new] = True
    return out


def select_legacy(
    ids: np.ndarray, smooth: np.ndarray, keep_ratio: float, params: LegacyParams = LegacyParams()
) -> LegacySelection:
    """The v1 selector over fixed chunks of `params.chunk_size` drafter tokens (reference §4.1).

    `ids`: drafter ids int [S]; `smooth`: legacy smoothed per-token scores float [S]
    (`legacy_smooth`). Forced chunks (head/tail, anchors, optionally repeat tokens) come first
    and may exceed n_keep (nothing is then added or dropped); the rest is filled by chunk mean,
    descending, ties to the lower chunk index (a stable sort; the reference's std::sort leaves
    ties unspecified).
    """
    ids = np.asarray(ids)
    smooth = np.asarray(smooth, dtype=np.float64)
    s = int(ids.size)
    c = params.chunk_size
    if s == 0:
        return LegacySelection((), (), 0, 0, 0)
    if smooth.size != s:
        raise ValueError(f"{smooth.size} scores for {s} ids")
    n_chunks = -(-s // c)
    n_keep = legacy_n_keep(n_chunks, keep_ratio)

    selected = np.zeros(n_chunks, dtype=bool)
    h, t = head_tail_counts(n_keep, params.head_chunks, params.tail_chunks)
    selected[: min(n_chunks, h)] = True
    if t > 0:
        selected[max(0, n_chunks - t) :] = True

    tier_radius, tier_hits = anchor_tier(n_chunks)
    radius = tier_radius if params.anchor_radius is None else params.anchor_radius
    max_hits = tier_hits if params.anchor_max_hits is None else params.anchor_max_hits
    selected |= anchor_chunks(ids, n_chunks, c, params.query_tokens, radius, max_hits)

    if params.repeat_rule:
        limit = n_keep if params.repeat_limit is None else params.repeat_limit
        selected = repeat_token_chunks(
            ids, selected, c, params.query_tokens, params.repeat_min, params.repeat_max, limit
        )
    forced = int(selected.sum())

    if forced < n_keep:
        begin = np.arange(n_chunks, dtype=np.int64) * c
        end = np.minimum(begin + c, s)
        means = (span_sums(smooth, begin, end) / (end - begin)).astype(np.float32)
        free = np.flatnonzero(~selected)
        ranked = free[np.lexsort((free, -means[free]))]
        selected[ranked[: n_keep - forced]] = True

    chunks = np.flatnonzero(selected)
    begin = chunks * c
    return LegacySelection(
        chunks=tuple(int(x) for x in chunks),
        kept=merge_runs(begin, np.minimum(begin + c, s)),
        n_keep=n_keep,
        n_chunks=n_chunks,
        forced=forced,
    )
