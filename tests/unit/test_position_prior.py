"""Lift over a position prior: the sink and the recency band stop outranking the evidence."""

from __future__ import annotations

import numpy as np

from pflash.compress.evidence.position_prior import (
    SINK_TOKENS,
    distance_bins,
    lift_over_prior,
    position_prior,
)


def _small_drafter_like_mass(n_ctx: int = 1000, n_query: int = 24) -> np.ndarray:
    """Sink on token 0, a 1/distance recency band, a flat floor, and a needle at 400..420."""
    j = np.arange(n_ctx)
    mass = 1e-4 + 2e-3 / (n_ctx - j)
    mass[0] = 0.5
    mass[400:420] *= 3.0  # three times what its neighbours get, far less than the recency band
    mass = np.concatenate([mass, np.full(n_query, 1e-3)])
    return mass / mass.sum()


def _chunk_sums(scores: np.ndarray, n_ctx: int, size: int = 20) -> np.ndarray:
    return scores[:n_ctx].reshape(-1, size).sum(axis=1)


def test_raw_mass_ranks_sink_and_recency_above_the_needle_but_lift_ranks_the_needle_first():
    mass = _small_drafter_like_mass()
    raw = _chunk_sums(mass, 1000)
    lifted = _chunk_sums(lift_over_prior(mass, 1000), 1000)
    needle = 400 // 20
    assert np.argsort(-raw).tolist().index(needle) >= 2  # sink chunk and recency chunk first
    assert int(np.argmax(lifted)) == needle


def test_tokens_from_the_question_on_keep_their_raw_mass():
    mass = _small_drafter_like_mass()
    lifted = lift_over_prior(mass, 1000)
    np.testing.assert_array_equal(lifted[1000:], mass[1000:])


def test_flat_mass_has_flat_lift():
    mass = np.full(500, 1 / 500)
    np.testing.assert_allclose(lift_over_prior(mass, 480)[:480], 1 / 500)


def test_prior_is_positive_and_sink_positions_share_one_bin():
    mass = _small_drafter_like_mass()
    bins = distance_bins(1000)
    assert set(bins[:SINK_TOKENS].tolist()) == {0} and (bins[SINK_TOKENS:] > 0).all()
    assert (np.diff(bins[SINK_TOKENS:]) <= 0).all()  # closer to the question = lower bin id
    assert (position_prior(mass, 1000) > 0).all()


def test_zero_mass_context_does_not_divide_by_zero():
    mass = np.zeros(100)
    mass[90:] = 0.1
    out = lift_over_prior(mass, 90)
    assert np.isfinite(out).all()


def test_no_context_is_a_no_op():
    mass = np.full(10, 0.1)
    np.testing.assert_array_equal(lift_over_prior(mass, 0), mass)
