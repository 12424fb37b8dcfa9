"""Attention lift over a position prior: take the sink and the recency band out of the ranking.

A small drafter's question rows put most of their mass on the first token (the attention
sink) and on the tokens just before the question (recency), whatever those tokens say. Raw
mass therefore ranks "near the question" above "about the question". Dividing each token's
mass by what a token at the same distance from the question usually receives (the prior)
leaves the part of the mass that the content earned: a needle in the middle of the context
with twice the mass of its neighbours outranks a recency-band token with its usual share.

The prior is estimated per prompt from the prompt itself, as the median mass in
log-spaced distance bins (the median ignores the few tokens the question really attends
to). Each of the first `SINK_TOKENS` positions is its own prior (lift 1): whatever mass a
sink holds is explained by its position. Pure numpy; no model.
"""

from __future__ import annotations

import numpy as np

SINK_TOKENS = 4  # positions that soak up mass in every prompt (BOS, template head)
BINS_PER_OCTAVE = 2  # distance bins: [1,1], [2,2], [3,4), [4,5)... half-octave wide
MIN_BIN_TOKENS = 8  # a sparser bin borrows its neighbours' prior
FLOOR_FRACTION = 1e-3  # prior floor, relative to the mean context mass (no division by ~0)


def distance_bins(query_begin: int) -> np.ndarray:
    """Bin id per context position j < query_begin: the sink, then log2-spaced distances."""
    j = np.arange(query_begin)
    distance = query_begin - j  # >= 1
    bins = 1 + np.floor(np.log2(distance) * BINS_PER_OCTAVE).astype(np.int64)
    bins[: min(SINK_TOKENS, query_begin)] = 0
    return bins


def position_prior(mass: np.ndarray, query_begin: int) -> np.ndarray:
    """Expected mass of each context position given only its distance from the question."""
    mass = np.asarray(mass, dtype=np.float64)
    if query_begin <= 0:
        return np.ones(0)
    ctx = mass[:query_begin]
    bins = distance_bins(query_begin)
    n_bins = int(bins.max()) + 1
    medians = np.full(n_bins, np.nan)
    for b in range(n_bins):
        sel = ctx[bins == b]
        if sel.size:
            medians[b] = np.median(sel)
    counts = np.bincount(bins, minlength=n_bins)
    for b in range(1, n_bins):  # sparse distance bins: borrow from the wider neighbours
        if counts[b] < MIN_BIN_TOKENS:
            lo, hi = max(1, b - 1), min(n_bins, b + 2)
            pool = ctx[(bins >= lo) & (bins < hi)]
            medians[b] = np.median(pool) if pool.size else medians[b]
    floor = max(float(ctx.mean()) * FLOOR_FRACTION, np.finfo(np.float64).tiny)
    prior = np.nan_to_num(medians, nan=floor)[bins]
    sink = min(SINK_TOKENS, query_begin)
    prior[:sink] = ctx[:sink]  # a sink position's mass is all position: lift 1
    return np.maximum(prior, floor)


def lift_over_prior(mass: np.ndarray, query_begin: int) -> np.ndarray:
    """Per-token scores: context mass / prior, times the context's mean mass (same scale).

    Tokens at or after `query_begin` (the question, pins, agent-loop suffix candidates) keep
    their raw mass, which is what the selector ranks them by.
    """
    mass = np.asarray(mass, dtype=np.float64)
    out = mass.copy()
    q = int(min(max(query_begin, 0), mass.size))
    if q == 0:
        return out
    scale = float(mass[:q].mean())
    out[:q] = mass[:q] / position_prior(mass, q) * scale
    return out
