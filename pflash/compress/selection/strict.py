"""The strict selector (ALGORITHM §4.4-§4.5) and the split selector (§4.6).

Mandatory candidates are charged to the token budget first (failing closed when they alone
exceed it); optional candidates are ranked by max(0, score), ties to the lower ordinal, and
added until the budget, top_p mass or top_k count stops the fill. Fixed chunks never skip
ahead to a smaller candidate; probe segments may (`skip_oversized`). Also the assembly
overhead fit (§4.9): extra tokens written at assembly are paid inside the budget by dropping
the lowest-ranked selected optional candidates."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pflash.compress.selection.candidates import (
    Candidates,
    StopReason,
    span_sums,
)
from pflash.spans import Span, canonicalize

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


def ranked_candidates(
    cands: Candidates, ordinals: Sequence[int], token_scores: np.ndarray
) -> tuple[Span, ...]:
    """The kept candidates, best first by the mean of `token_scores` over each (ties in
    position order). The mean, not the candidate's selection score: pinned and promoted
    candidates are kept whatever their score, and recall (§6.2) ranks what the question
    attends to by density."""
    idx = _indices_of(cands, ordinals)
    begin, end = cands.begin[idx], cands.end[idx]
    means = span_sums(token_scores, begin, end) / np.maximum(end - begin, 1)
    order = np.lexsort((begin, -means))
    return tuple(Span(int(begin[i]), int(end[i])) for i in order.tolist())
