"""The tap projection (`pflash.models.projection`, `pflash projection train`): the file binds
to its drafter and refuses anything else by name, the serving cosine is the training
cosine, and training on the InfoNCE loss learns a signal a random projection misses.
Synthetic taps only: no model is loaded."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from pflash.errors import ModelUnavailable
from pflash.models.probe import ProbeIdentity, write_gguf
from pflash.models.projection import (
    NS,
    WEIGHT,
    ProjectionFile,
    load_tap_projection,
    pooled_rows,
    projection_fields,
    projection_for,
    projection_tensors,
    read_projection_gguf,
    write_projection_gguf,
)
from pflash.spans import Span
from pflash_lab.train.projection import (
    PassageLayout,
    TrainOptions,
    all_scores,
    evidence_ranks,
    features_from_tap,
    info_nce,
    initial_weight,
    positives,
    rank_metrics,
    torch_scores,
    train_projection,
)

torch.set_num_threads(1)

N_EMBD, DIM = 16, 6
SHA = "3f" * 32
IDENTITY = ProbeIdentity(
    "smollm2_135m", "smollm2-135M", "post_block7_residual_before_block8", SHA, N_EMBD
)


def projection_file(seed: int = 0, **changes) -> ProjectionFile:
    weight = np.random.default_rng(seed).normal(size=(DIM, N_EMBD)).astype(np.float32)
    f = ProjectionFile(
        family=IDENTITY.family,
        base_model=IDENTITY.base_model,
        feature_tap=IDENTITY.feature_tap,
        runtime_gguf_sha256=IDENTITY.runtime_gguf_sha256,
        n_embd=N_EMBD,
        weight=weight,
        temperature=0.05,
        trained_on="unit test",
    )
    return dataclasses.replace(f, **changes)


def refused(path, identity=IDENTITY) -> str:
    with pytest.raises(ModelUnavailable) as err:
        load_tap_projection(path, identity)
    return str(err.value)


# --------------------------------------------------------------------------- the file


def test_file_round_trips_every_field(tmp_path):
    f = projection_file()
    back = read_projection_gguf(write_projection_gguf(tmp_path / "p.gguf", f))
    for key in ("family", "base_model", "feature_tap", "runtime_gguf_sha256", "n_embd"):
        assert getattr(back, key) == getattr(f, key)
    assert back.schema == "smollm2_135m_tap_projection_v1"
    assert back.trained_on == "unit test"
    assert back.temperature == pytest.approx(0.05)
    assert back.dim == DIM
    np.testing.assert_array_equal(back.weight, f.weight)


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("family", "qwen3_0_6b", "schema"),
        ("base_model", "other-model", "base_model"),
        ("feature_tap", "post_block16_residual_before_block17", "feature_tap"),
        ("runtime_gguf_sha256", "ab" * 32, "trained for a different drafter file"),
        ("n_embd", N_EMBD + 1, "n_embd"),
    ],
)
def test_projection_for_another_drafter_is_refused_with_the_field_named(
    tmp_path, field, value, named
):
    path = write_projection_gguf(tmp_path / "p.gguf", projection_file())
    message = refused(path, dataclasses.replace(IDENTITY, **{field: value}))
    assert named in message
    assert str(path) in message


def test_missing_file_says_how_to_provide_one(tmp_path):
    message = refused(tmp_path / "absent.gguf")
    assert "not found" in message
    assert "projection_gguf" in message
    assert "pflash projection train" in message


def broken(tmp_path, *, drop=(), set_fields=None, weight=None) -> Path:
    fields = projection_fields(projection_file())
    for key in drop:
        del fields[key]
    fields.update(set_fields or {})
    tensors = projection_tensors(projection_file())
    if weight is not None:
        tensors[WEIGHT] = weight
    return write_gguf(tmp_path / "broken.gguf", fields, tensors)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"drop": (f"{NS}.feature_tap",)}, f"lacks metadata key {NS}.feature_tap"),
        ({"set_fields": {f"{NS}.n_embd": ("16", "STRING")}}, f"{NS}.n_embd must be UINT32"),
        ({"set_fields": {f"{NS}.temperature": (0.0, "FLOAT32")}}, f"{NS}.temperature"),
        ({"set_fields": {f"{NS}.schema": ("segment_probe_v2", "STRING")}}, f"{NS}.schema"),
        ({"set_fields": {"general.architecture": ("llama", "STRING")}}, "general.architecture"),
        ({"weight": np.full((DIM, N_EMBD), np.nan, np.float32)}, "non-finite"),
        ({"weight": np.zeros((DIM, N_EMBD + 2), np.float32)}, "expected [16, dim]"),
    ],
)
def test_broken_file_is_refused_with_what_is_wrong(tmp_path, kwargs, named):
    message = refused(broken(tmp_path, **kwargs))
    assert named in message


@pytest.mark.parametrize(
    "config",
    [
        SimpleNamespace(select_projection_weight=0.5, projection_gguf=None),
        SimpleNamespace(projection_gguf=""),
    ],
)
def test_asking_for_a_projection_without_a_file_says_how_to_provide_one(config):
    with pytest.raises(ModelUnavailable, match="projection_gguf is empty"):
        projection_for(config, scorer=None)


# --------------------------------------------------------------------------- the math


def loaded(tmp_path, seed: int = 0):
    path = write_projection_gguf(tmp_path / "p.gguf", projection_file(seed))
    return load_tap_projection(path, IDENTITY)


def random_tap(seed: int, rows: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scale = rng.uniform(0.1, 50.0, size=(rows, 1))  # rows differ in scale by orders
    return (rng.normal(size=(rows, N_EMBD)) * scale).astype(np.float32)


def test_passage_made_of_the_question_rows_ranks_first(tmp_path):
    proj = loaded(tmp_path)
    tap = random_tap(1, 40)
    tap[30:34] = tap[2:6]  # passage 3 repeats the question's rows
    passages = [Span(8, 14), Span(14, 22), Span(22, 30), Span(30, 34), Span(34, 40)]
    sims = proj.similarity(tap, Span(2, 6), passages)
    assert sims.dtype == np.float64 and sims.shape == (5,)
    assert int(np.argmax(sims)) == 3
    assert sims[3] == pytest.approx(1.0)


def test_similarity_ignores_the_scale_of_each_row(tmp_path):
    proj = loaded(tmp_path)
    tap = random_tap(2, 30)
    scaled = tap * np.random.default_rng(3).uniform(0.01, 100.0, size=(30, 1)).astype(np.float32)
    passages = [Span(6, 12), Span(12, 20), Span(20, 30)]
    np.testing.assert_allclose(
        proj.similarity(scaled, Span(0, 6), passages),
        proj.similarity(tap, Span(0, 6), passages),
        atol=1e-6,
    )


@pytest.mark.parametrize(
    ("question", "passages", "poison"),
    [
        (Span(3, 3), [Span(4, 8)], False),
        (Span(0, 3), [Span(4, 4)], False),
        (Span(0, 3), [Span(4, 99)], False),
        (Span(0, 3), [Span(4, 8)], True),
    ],
)
def test_empty_or_outside_span_or_non_finite_rows_raise(tmp_path, question, passages, poison):
    tap = random_tap(4, 10)
    if poison:
        tap[5, 2] = np.inf
    with pytest.raises(ValueError):
        loaded(tmp_path).similarity(tap, question, passages)


def test_serving_numpy_scores_equal_training_torch_scores(tmp_path):
    proj = loaded(tmp_path, seed=5)
    tap = random_tap(6, 60)
    layout = PassageLayout(
        Span(50, 58), tuple(Span(b, b + 10) for b in range(0, 50, 10)), np.eye(5, dtype=bool)[1]
    )
    feats = features_from_tap("f", "val", tap, layout)
    served = proj.similarity(tap, layout.question, layout.passages)
    trained = torch_scores(torch.from_numpy(read_projection_gguf(proj.path).weight), feats)
    np.testing.assert_allclose(trained.numpy(), served, atol=1e-5)
    np.testing.assert_allclose(
        feats.passages, pooled_rows(tap, layout.passages), rtol=0, atol=0
    )  # training pools with the serving function


# --------------------------------------------------------------------------- training


def test_evidence_passages_and_their_ranks():
    pos = positives([Span(0, 5), Span(5, 10), Span(10, 15)], [Span(8, 12)])
    assert pos.tolist() == [False, True, True]
    scores = np.array([0.9, 0.1, 0.5])
    assert evidence_ranks(scores, pos).tolist() == [3, 2]
    m = rank_metrics([scores], [pos], fraction=0.5)  # budget ceil(1.5) = 2 passages
    assert (m.positives, m.positives_top, m.all_top, m.mrr) == (2, 1, 0, 0.5)


def test_info_nce_is_minus_log_of_the_positives_softmax_share():
    scores = torch.tensor([0.2, 0.9, -0.3, 0.5])
    mask = torch.tensor([False, True, False, True])
    share = torch.softmax(scores / 0.1, 0)[mask].sum()
    assert float(info_nce(scores, mask, 0.1)) == pytest.approx(float(-torch.log(share)), abs=1e-5)


def test_initial_weight_is_orthonormal_and_fixed_by_the_seed():
    w = initial_weight(DIM, N_EMBD, seed=7)
    assert w.shape == (DIM, N_EMBD) and w.dtype == torch.float32
    torch.testing.assert_close(w @ w.T, torch.eye(DIM), atol=1e-5, rtol=0)
    assert torch.equal(w, initial_weight(DIM, N_EMBD, seed=7))
    assert not torch.equal(w, initial_weight(DIM, N_EMBD, seed=8))


H, SIGNAL = 32, 8  # the answer lives in the last SIGNAL dims, under louder topic dims
ROWS, PASSAGES = 4, 10


def synthetic_prompt(rng: np.random.Generator, family: str):
    """Question rows and the positive passage's rows share a vector in the signal dims;
    every span also has its own loud topic vector in the other dims, which a random
    projection mostly sees."""

    def span_rows(signal: np.ndarray) -> np.ndarray:
        topic = np.concatenate([rng.normal(0, 3.0, H - SIGNAL), np.zeros(SIGNAL)])
        return (
            topic + np.concatenate([np.zeros(H - SIGNAL), signal]) + rng.normal(0, 0.3, (ROWS, H))
        )

    answer = rng.normal(0, 1.0, SIGNAL)
    hit = int(rng.integers(PASSAGES))
    blocks = [span_rows(answer)] + [
        span_rows(answer if j == hit else rng.normal(0, 1.0, SIGNAL)) for j in range(PASSAGES)
    ]
    tap = np.concatenate(blocks).astype(np.float32)  # [(1 + PASSAGES) * ROWS, H]
    passages = tuple(Span(ROWS * (j + 1), ROWS * (j + 2)) for j in range(PASSAGES))
    layout = PassageLayout(Span(0, ROWS), passages, np.arange(PASSAGES) == hit)
    return features_from_tap(family, "train", tap, layout)


def test_training_learns_what_a_random_projection_misses():
    rng = np.random.default_rng(0)
    train = [synthetic_prompt(rng, "a") for _ in range(240)]  # fewer are memorised
    val = [synthetic_prompt(rng, "b") for _ in range(20)]
    opts = TrainOptions(dim=SIGNAL, epochs=15, lr=1e-2, temperature=0.1, batch_prompts=8)
    weight, history = train_projection(train, val, opts, progress=False)
    init = history[0]["val_recall_top"]
    best = max(h["val_recall_top"] for h in history)
    trained = rank_metrics(
        all_scores(torch.from_numpy(weight), val), [f.layout.positive for f in val], 0.1
    )
    assert weight.shape == (SIGNAL, H) and weight.dtype == np.float32
    assert trained.recall_top == best  # the best epoch's weight is the one returned
    assert init < 0.5
    assert trained.recall_top >= 0.8


def test_remembered_pooled_passages_are_read_only_where_the_rows_were_reused():
    from pflash.models.projection import pooled_rows, reused_pooled_rows

    rng = np.random.default_rng(3)
    tap = rng.normal(size=(40, 8)).astype(np.float32)
    spans = [Span(0, 10), Span(10, 20), Span(20, 30), Span(30, 40)]
    marker = np.full(8, 7.0)
    memo = {Span(0, 10): marker, Span(20, 30): marker, Span(5, 6): marker}
    out = reused_pooled_rows(tap, spans, memo=memo, reusable_end=25)
    exact = pooled_rows(tap, spans)
    np.testing.assert_array_equal(out[0], marker)  # inside the reused rows: read
    np.testing.assert_array_equal(out[1:], exact[1:])  # ends past row 25: pooled again
    assert set(memo) == set(spans)  # this call's spans only
    np.testing.assert_array_equal(memo[Span(20, 30)], exact[2])
    again = reused_pooled_rows(tap, spans, memo={}, reusable_end=40)
    np.testing.assert_array_equal(again, exact)
