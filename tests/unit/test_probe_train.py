"""Probe training: determinism, learning a boundary signal, the cut-level scores, the choice
of threshold and min_segment on held-out data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pflash.compress.plan.segments import ProbeParams
from pflash_lab.train.probe import (
    BoundaryScore,
    Features,
    TrainOptions,
    choose_cut_params,
    probabilities,
    score_cuts,
    train_probe,
)

torch.set_num_threads(1)

N_EMBD = 16


def synthetic_features(seed: int, docs: int = 8, length: int = 60) -> Features:
    """Tap-like rows where a boundary token carries a fixed direction plus noise; the first
    4 tokens of each document play the chat prefix (masked out)."""
    rng = np.random.default_rng(seed)
    direction = np.random.default_rng(99).standard_normal(N_EMBD).astype(np.float32)
    n = docs * length
    x = rng.standard_normal((n, N_EMBD)).astype(np.float32)
    unit = np.zeros(n, dtype=bool)
    for d in range(docs):
        for t in range(d * length + 6, (d + 1) * length, 9):
            unit[t] = True
    x[unit] += 3.0 * direction
    mask = np.ones(n, dtype=bool)
    for d in range(docs):
        mask[d * length : d * length + 4] = False
    offsets = np.arange(0, n + 1, length, dtype=np.int64)
    return Features(x, unit, unit.copy(), mask, offsets, ("files",) * docs)


OPTS = TrainOptions(width=8, epochs=3, batch_docs=2, min_segments=(1, 4), max_segment=64)


def test_training_is_deterministic_from_the_seed():
    train, val = synthetic_features(0), synthetic_features(1, docs=2)
    a, _ = train_probe(train, val, OPTS, progress=False)
    b, _ = train_probe(train, val, OPTS, progress=False)
    for name, array in a.tensors().items():
        np.testing.assert_array_equal(array, b.tensors()[name], err_msg=name)
    c, _ = train_probe(train, val, TrainOptions(**{**OPTS.__dict__, "seed": 1}), progress=False)
    assert not np.array_equal(a.tensors()["fc1.weight"], c.tensors()["fc1.weight"])


def test_training_learns_a_boundary_signal_and_picks_precise_cut_params():
    train, val = synthetic_features(0, docs=16), synthetic_features(1, docs=4)
    opts = TrainOptions(**{**OPTS.__dict__, "epochs": 40, "lr": 1e-2})
    net, history = train_probe(train, val, opts, progress=False)
    assert history[-1]["train"] < history[0]["train"] / 4
    unit, _ = probabilities(net, val)
    params, table = choose_cut_params(unit, val, opts)
    best = next(
        r
        for r in table
        if r["threshold"] == params.threshold and r["min_segment"] == params.min_segment
    )
    assert best["precision"] >= 0.9 and best["recall"] >= 0.9
    assert params.max_segment == 64


def test_cut_scores_count_exact_token_matches_inside_the_document():
    boundary = np.array([0.99, 0.1, 0.95, 0.2, 0.97, 0.96, 0.1, 0.1, 0.99, 0.1])
    unit = np.array([0, 0, 1, 0, 1, 0, 0, 1, 0, 0], dtype=bool)
    mask = np.array([0, 1, 1, 1, 1, 1, 1, 1, 1, 1], dtype=bool)  # token 0: chat prefix
    # cuts above 0.9 after the first document token (1): 2, 4, 5, 8; true: 2, 4, 7
    s = score_cuts(boundary, unit, mask, ProbeParams(0.9, 1, 100))
    assert s == BoundaryScore(true_positive=2, predicted=4, actual=3)
    # min_segment 2 drops the cut at 5 (one token after 4)
    s = score_cuts(boundary, unit, mask, ProbeParams(0.9, 2, 100))
    assert (s.precision, s.recall) == (pytest.approx(2 / 3), pytest.approx(2 / 3))


def test_cut_params_take_the_highest_recall_that_reaches_the_target_precision():
    unit = np.zeros(40, dtype=bool)
    unit[[10, 20, 30]] = True
    prob = np.full(40, 0.01)
    prob[[10, 20]] = 0.97  # two confident true boundaries
    prob[30] = 0.6  # a less confident true one
    prob[25] = 0.5  # a false one below it
    feats = Features(
        np.zeros((40, 1), np.float32), unit, unit, np.ones(40, bool), np.array([0, 40]), ("x",)
    )
    opts = TrainOptions(min_segments=(1,), target_precision=0.9, max_segment=100)
    params, _ = choose_cut_params(prob, feats, opts)
    assert 0.5 <= params.threshold < 0.6  # all three true cuts, the false one excluded
    assert params.min_segment == 1
