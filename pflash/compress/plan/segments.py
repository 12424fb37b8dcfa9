"""Candidate spans for strict selection: the fixed chunk grid and probe segmentation.

Every span here is half-open `[begin, end)` in **drafter tokens** over the S drafter ids of one
prompt. A segmentation is a pair of int64 arrays (`begin`, `end`) that tile `[0, S)` in order,
so candidate ordinals are also source order.

Two ways to cut the prompt (reference ALGORITHM.md §4.3, §4.7):
- the fixed grid `[cC, min(S, (c+1)C))`, with C scheduled by length unless configured;
- probe segments: cut where the segment probe's smoothed boundary probability is above its
  threshold, never inside `min_segment` of the last cut unless the cut is forced (query and
  pinned-span edges), then split segments longer than `max_segment` at the best interior score.

The structural "mandatory" rule (`structurally_required`) lives here too, because the budget
(§5.7, on the fixed grid) and the selector (§4.4, on whatever candidates were built) must apply
exactly the same rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from pflash.errors import CompressionFailed
from pflash.spans import Span, canonicalize

SegmentKind = Literal["fixed", "probe"]
SegmentsMode = Literal["auto", "fixed", "probe"]

PROBE_MIN_BOUNDARIES = 4  # auto mode uses the probe only when it finds at least this many


def scheduled_chunk_size(n_tokens: int, explicit: int | None = None) -> int:
    """Fixed chunk size in drafter tokens for a prompt of `n_tokens` drafter tokens.

    An explicit size wins. Otherwise S < 500 -> 128, S < 3000 -> 512, else 1024: short prompts
    get fine chunks so the budget can still choose among several (reference §4.3).
    """
    if explicit is not None:
        if explicit <= 0:
            raise ValueError(f"chunk size must be positive, got {explicit}")
        return int(explicit)
    if n_tokens < 500:
        return 128
    if n_tokens < 3000:
        return 512
    return 1024


MIN_CHUNK_TOKENS = 64


def fitted_chunk_size(chunk_size: int, token_budget: int) -> int:
    """The chunk size cut to the token budget (drafter tokens): a pin makes its whole chunk
    mandatory, so a chunk larger than the budget turns every pinned question or system line
    into more than the whole budget (a short chat at a low keep ratio with large chunks
    keeps most of its prompt). A chunk of `MIN_CHUNK_TOKENS` is always allowed (shorter ones
    cut sentences apart), and a configured smaller chunk is kept as it is."""
    return min(chunk_size, max(MIN_CHUNK_TOKENS, token_budget))


def fixed_grid(n_tokens: int, chunk_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The chunk grid over `n_tokens` drafter tokens: begin, end int64 [ceil(S/C)]; the last
    chunk may be shorter."""
    if chunk_size <= 0:
        raise ValueError(f"chunk size must be positive, got {chunk_size}")
    begin = np.arange(0, max(0, n_tokens), chunk_size, dtype=np.int64)
    end = np.minimum(begin + chunk_size, n_tokens)
    return begin, end


def _span_arrays(spans: Sequence[Span]) -> tuple[np.ndarray, np.ndarray]:
    merged = canonicalize(spans)
    return (
        np.fromiter((s.begin for s in merged), np.int64, len(merged)),
        np.fromiter((s.end for s in merged), np.int64, len(merged)),
    )


def overlaps_any(begin: np.ndarray, end: np.ndarray, spans: Sequence[Span]) -> np.ndarray:
    """bool [n]: candidate `[begin[i], end[i])` overlaps at least one of `spans`.

    Vectorised: after canonicalising, span ends are sorted, so the only span that can overlap a
    candidate is the first one ending after the candidate's begin.
    """
    sb, se = _span_arrays(spans)
    if sb.size == 0:
        return np.zeros(begin.shape, dtype=bool)
    i = np.searchsorted(se, begin, side="right")
    inside = i < sb.size
    return inside & (sb[np.minimum(i, sb.size - 1)] < end)


def structurally_required(
    begin: np.ndarray,
    end: np.ndarray,
    *,
    query: Span,
    pinned: Sequence[Span],
    suffix_candidates: bool,
) -> np.ndarray:
    """bool [n]: candidates that must be kept whatever their score (reference §4.4).

    A candidate is mandatory when it overlaps the scorer query window `query`, overlaps any
    pinned span, or - unless `suffix_candidates` (agent loop) - ends after `query.end` (the
    structural suffix: everything after the question is kept).
    """
    begin = np.asarray(begin, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)
    required = (begin < query.end) & (end > query.begin)
    required |= overlaps_any(begin, end, pinned)
    if not suffix_candidates:
        required |= end > query.end
    return required


def required_grid_tokens(
    n_tokens: int,
    chunk_size: int,
    *,
    query: Span,
    pinned: Sequence[Span],
    suffix_candidates: bool,
) -> int:
    """K: drafter tokens in fixed chunks that are structurally required (reference §5.7)."""
    begin, end = fixed_grid(n_tokens, chunk_size)
    mask = structurally_required(
        begin, end, query=query, pinned=pinned, suffix_candidates=suffix_candidates
    )
    return int((end - begin)[mask].sum())


# ---------------------------------------------------------------------------- probe segments


@dataclass(frozen=True)
class ProbeParams:
    """Segment probe cut parameters, read from the probe GGUF (reference §7.2).

    `threshold` in (0, 1): a boundary is a token whose smoothed probability is strictly above it.
    `min_segment` >= 1 and `max_segment` >= `min_segment`, in drafter tokens.
    """

    threshold: float
    min_segment: int
    max_segment: int

    def __post_init__(self) -> None:
        if not (math.isfinite(self.threshold) and 0.0 < self.threshold < 1.0):
            raise ValueError(f"probe threshold must be in (0, 1), got {self.threshold}")
        if self.min_segment < 1:
            raise ValueError(f"probe min_segment must be >= 1, got {self.min_segment}")
        if self.max_segment < self.min_segment:
            raise ValueError(
                f"probe max_segment {self.max_segment} is below min_segment {self.min_segment}"
            )


def smooth_boundary_logits(raw: np.ndarray, conv_w: np.ndarray, conv_b: float) -> np.ndarray:
    """Boundary probabilities from raw probe logits (reference §4.7 step 2).

    `b_t = sigmoid(raw_t + conv_b + sum_k w_k * raw_{t+k-r})`, r = taps // 2, out-of-range
    terms dropped: a torch Conv1d with symmetric zero padding plus a residual, so the raw logit
    enters twice (residual and centre tap). raw: float [S]; conv_w: float [taps], taps odd.
    Returns float32 [S].
    """
    raw = np.asarray(raw, dtype=np.float64)
    w = np.asarray(conv_w, dtype=np.float64).ravel()
    if w.size % 2 != 1:
        raise ValueError(f"probe conv needs an odd number of taps, got {w.size}")
    r = w.size // 2
    # full convolution with the reversed taps is the correlation sum_k w_k raw[t+k-r], shifted
    conv = np.convolve(raw, w[::-1], mode="full")[r : r + raw.size]
    x = raw + float(conv_b) + conv
    e = np.exp(-np.abs(x))  # sigmoid without overflow for either sign
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(np.float32)


def count_probe_boundaries(
    boundary: np.ndarray, threshold: float, *, query: Span, suffix_candidates: bool
) -> int:
    """Boundaries the auto gate counts: t in [1, S) with b_t > threshold, ignoring t >= the
    query begin (everything after it is kept), or only the query window itself when suffix
    candidates are on (reference §4.7 step 3)."""
    b = np.asarray(boundary)
    t = np.arange(b.size)
    keep = (t >= 1) & (b > threshold)
    if suffix_candidates:
        keep &= ~((t >= query.begin) & (t < query.end))
    else:
        keep &= t < query.begin
    return int(np.count_nonzero(keep))


def probe_cuts(
    boundary: np.ndarray, params: ProbeParams, forced_cuts: Sequence[int] = ()
) -> np.ndarray:
    """Cut positions int64 [k+1] from 0 to S inclusive (reference §4.7 step 4).

    A token t in [1, S) is a cut if it is forced, or if b_t is finite and strictly above the
    threshold and at least `min_segment` tokens after the previous cut. Forced cuts always
    survive. The walk visits only candidate cuts (jumping with binary search), not every token.
    """
    b = np.asarray(boundary)
    s = int(b.size)
    with np.errstate(invalid="ignore"):
        free = np.flatnonzero(np.isfinite(b) & (b > params.threshold))
    free = free[free >= 1]
    forced = np.unique(np.asarray([c for c in forced_cuts if 0 < c < s], dtype=np.int64))
    if params.min_segment <= 1:
        inner = np.union1d(free, forced)
    else:
        cuts: list[int] = []
        last = 0
        fi = 0  # next forced cut index
        while True:
            j = int(np.searchsorted(free, last + params.min_segment, side="left"))
            nxt_free = int(free[j]) if j < free.size else s
            while fi < forced.size and forced[fi] <= last:
                fi += 1
            nxt_forced = int(forced[fi]) if fi < forced.size else s
            nxt = min(nxt_free, nxt_forced)
            if nxt >= s:
                break
            cuts.append(nxt)
            last = nxt
        inner = np.asarray(cuts, dtype=np.int64)
    return np.concatenate(([0], inner.astype(np.int64), [s])).astype(np.int64)


def split_oversize(
    cuts: np.ndarray, params: ProbeParams, interior: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Segments (begin, end int64) from cuts, splitting any longer than `max_segment`.

    A long span [b, e) is cut at the highest finite `interior` score > 0 in
    [max(b + min, b + max // 2), min(e - min, b + max)] (first one on ties), else at b + max,
    and the rest is split again (reference §4.7 step 5). The window keeps every piece at least
    `min_segment` long and the cut off the near edge. `interior` is the sub-unit score when the
    probe has one, else the unit boundary score.
    """
    begins: list[int] = []
    ends: list[int] = []
    mn, mx = params.min_segment, params.max_segment
    score = np.asarray(interior, dtype=np.float64)
    lengths = np.diff(cuts)
    if not np.any(lengths > mx):
        return cuts[:-1].copy(), cuts[1:].copy()
    for b, e in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True):
        while e - b > mx:
            lo = max(b + mn, b + mx // 2)
            hi = min(e - mn, b + mx)
            best = b + mx
            if lo <= hi:
                window = score[lo : hi + 1]
                window = np.where(np.isfinite(window), window, 0.0)
                k = int(np.argmax(window))
                if window[k] > 0.0:
                    best = lo + k
            begins.append(b)
            ends.append(best)
            b = best
        begins.append(b)
        ends.append(e)
    return np.asarray(begins, dtype=np.int64), np.asarray(ends, dtype=np.int64)


def probe_forced_cuts(query: Span, pinned: Sequence[Span]) -> list[int]:
    """Cuts the probe must make: the query window edges and every pinned-span edge, so no
    segment straddles a mandatory and an optional region."""
    out = [query.begin, query.end]
    for s in pinned:
        out.extend((s.begin, s.end))
    return out


@dataclass(frozen=True, eq=False)
class Segmentation:
    """Candidate spans for one prompt, in drafter tokens, tiling [0, S) in order.

    - `begin`, `end`: int64 [n].
    - `kind`: "fixed" (grid of `chunk_size`) or "probe" (`chunk_size` 0, as in the trace).
    - `boundaries`: probe boundaries counted by the gate (0 when the probe did not run).
    - `fallback`: why auto mode fell back to fixed chunks, for the log; None otherwise.
    """

    begin: np.ndarray
    end: np.ndarray
    kind: SegmentKind
    chunk_size: int
    boundaries: int = 0
    fallback: str | None = None

    def __len__(self) -> int:
        return int(self.begin.size)

    def spans(self) -> tuple[Span, ...]:
        return tuple(
            Span(b, e) for b, e in zip(self.begin.tolist(), self.end.tolist(), strict=True)
        )


def segment(
    n_tokens: int,
    *,
    mode: SegmentsMode,
    chunk_size: int,
    query: Span,
    pinned: Sequence[Span],
    suffix_candidates: bool,
    boundary: np.ndarray | None = None,
    subunit: np.ndarray | None = None,
    params: ProbeParams | None = None,
) -> Segmentation:
    """Choose and build the candidate spans (reference §4.7 steps 3-5, `segments` override).

    - `fixed`: the grid of `chunk_size`.
    - `probe`: probe segments; a missing probe output is a `CompressionFailed("probe")`.
    - `auto`: probe segments when a probe ran (`boundary` given) and the gate counts at least
      `PROBE_MIN_BOUNDARIES` boundaries; otherwise the grid, with the reason in `fallback`.

    `boundary`/`subunit`: smoothed probabilities float [S] from the probe (unit and optional
    sub-unit head); `pinned`: merged pinned spans (their edges become forced cuts).
    """
    if mode not in ("auto", "fixed", "probe"):
        raise ValueError(f"segments mode must be auto, fixed or probe, got {mode!r}")
    fallback: str | None = None
    boundaries = 0
    if mode != "fixed":
        if boundary is None or params is None:
            if mode == "probe":
                raise CompressionFailed("probe", "segments=probe but no segment probe output")
            fallback = "no segment probe"
        else:
            if len(boundary) != n_tokens:
                raise CompressionFailed(
                    "probe", f"probe gave {len(boundary)} scores for {n_tokens} drafter tokens"
                )
            boundaries = count_probe_boundaries(
                boundary, params.threshold, query=query, suffix_candidates=suffix_candidates
            )
            if mode == "probe" or boundaries >= PROBE_MIN_BOUNDARIES:
                cuts = probe_cuts(boundary, params, probe_forced_cuts(query, pinned))
                interior = subunit if subunit is not None and len(subunit) >= n_tokens else boundary
                begin, end = split_oversize(cuts, params, interior)
                return Segmentation(begin, end, "probe", 0, boundaries)
            fallback = f"probe found {boundaries} boundaries (< {PROBE_MIN_BOUNDARIES})"
    begin, end = fixed_grid(n_tokens, chunk_size)
    return Segmentation(begin, end, "fixed", chunk_size, boundaries, fallback)
