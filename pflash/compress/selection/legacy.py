"""The legacy selector (ALGORITHM §4.1): fixed 32-token chunks, head/tail forcing, 4-gram
lexical anchors, the optional Qwen3.5 repeat-token rule, then fill by chunk mean up to n_keep
chunks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pflash.compress.selection.candidates import span_sums
from pflash.compress.selection.strict import merge_runs
from pflash.spans import Span

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
        """From the compression's config (`CompressionPart`: the legacy component and
        selection's `anchor_query_tokens`); `repeat_rule` is the drafter profile's choice
        (Qwen3.5)."""
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
