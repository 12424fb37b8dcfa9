"""The trained scoring head file (§3.4, §7.1): format, binding to the drafter, use in scoring."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conftest import UNTUNED

from pflash.compress.plan.query import QueryWindow
from pflash.compress.scoring import ScoreRequest
from pflash.config import build_config
from pflash.errors import ConfigError, ModelUnavailable
from pflash.models.drafter.scorer import DrafterScorer
from pflash.models.drafter.scoring_head import save_scoring_head
from pflash.models.gguf_io import (
    ScoringHeadFile,
    read_scoring_head_gguf,
    tiny_decoder,
    write_decoder_gguf,
    write_scoring_head_gguf,
)
from pflash.models.loading import load_causal_lm
from pflash.spans import Span

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def drafter(tmp_path_factory):
    """A tiny qwen35 drafter GGUF (full attention at layer 3) loaded through our loader."""
    root = tmp_path_factory.mktemp("head")
    mp = pytest.MonkeyPatch()
    mp.setenv("PFLASH_CACHE_DIR", str(root / "cache"))
    path = write_decoder_gguf(tiny_decoder("qwen3_5", seed=7), root / "drafter.gguf")
    loaded = load_causal_lm(str(path))
    yield root, loaded
    mp.undo()


def base_scorer(loaded, **config) -> DrafterScorer:
    return DrafterScorer(
        build_config(UNTUNED | {"drafter_chunk_tokens": 16} | config, env={}), loaded
    )


def untrained_head_weights(scorer):
    """The scoring layer's own projections as a head: query rows only (no gate)."""
    attn = scorer.layer.self_attn
    h, d = scorer.n_head, scorer.head_dim
    q = attn.q_proj.weight.detach().view(h, 2 * d, -1)[:, :d].reshape(h * d, -1)
    return q.numpy().copy(), attn.k_proj.weight.detach().numpy().copy()


def request(seed=0):
    ids = tuple(
        torch.randint(0, 300, (60,), generator=torch.Generator().manual_seed(seed)).tolist()
    )
    windows = (QueryWindow(Span(59, 60), 1.0, "main"), QueryWindow(Span(40, 48), 1.0, "turn"))
    return ScoreRequest(ids=ids, windows=windows, query=Span(59, 60))


def test_scoring_head_file_round_trips(tmp_path):
    rng = np.random.default_rng(0)
    head = ScoringHeadFile(
        schema="qwen3_5_0_8b_nope_qk_mass_v1",
        base_model="Qwen/Qwen3.5-0.8B",
        runtime_gguf_sha256="ab" * 32,
        feature_tap="post_block14_residual_before_block15",
        attn_q=rng.standard_normal((16, 8)).astype(np.float32),
        attn_k=rng.standard_normal((4, 8)).astype(np.float32),
    )
    back = read_scoring_head_gguf(write_scoring_head_gguf(tmp_path / "h.gguf", head))
    assert (back.schema, back.base_model, back.runtime_gguf_sha256, back.feature_tap) == (
        head.schema,
        head.base_model,
        head.runtime_gguf_sha256,
        head.feature_tap,
    )
    np.testing.assert_array_equal(back.attn_q, head.attn_q)
    np.testing.assert_array_equal(back.attn_k, head.attn_k)


def test_head_identity_binds_schema_base_model_tap_and_drafter_sha(drafter):
    _, loaded = drafter
    ident = base_scorer(loaded).head_identity()
    assert ident.schema.endswith("_nope_qk_mass_v1")
    assert ident.feature_tap == "post_block2_residual_before_block3"
    assert ident.runtime_gguf_sha256 == loaded.sha256


def test_head_with_the_layers_own_weights_scores_like_the_untrained_head(drafter):
    root, loaded = drafter
    base = base_scorer(loaded)
    q, k = untrained_head_weights(base)
    path = save_scoring_head(root / "same.gguf", base.head_identity(), q, k)
    with_head = base_scorer(loaded, scoring_head_gguf=str(path))
    got, want = with_head(request()), base(request())
    assert got.extras["trained_head"] is True
    np.testing.assert_allclose(got.mass, want.mass, atol=1e-6)


def test_a_trained_head_changes_the_scores(drafter):
    root, loaded = drafter
    base = base_scorer(loaded)
    q, k = untrained_head_weights(base)
    rng = np.random.default_rng(1)
    path = save_scoring_head(
        root / "trained.gguf",
        base.head_identity(),
        q + rng.standard_normal(q.shape).astype(np.float32),
        k,
    )
    got = base_scorer(loaded, scoring_head_gguf=str(path))(request())
    assert np.abs(got.mass - base(request()).mass).max() > 1e-3
    assert got.mass.sum() == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize(
    "field, value",
    [
        ("runtime_gguf_sha256", "0" * 64),
        ("schema", "qwen3_5_0_8b_nope_qk_mass_v2"),
        ("base_model", "Qwen/Qwen3.5-2B"),
        ("feature_tap", "post_block14_residual_before_block15"),
    ],
)
def test_a_head_that_does_not_fit_the_drafter_is_refused_naming_the_mismatch(drafter, field, value):
    root, loaded = drafter
    base = base_scorer(loaded)
    q, k = untrained_head_weights(base)
    ident = dataclasses.replace(base.head_identity(), **{field: value})
    path = save_scoring_head(root / f"bad-{field}.gguf", ident, q, k)
    with pytest.raises(ModelUnavailable, match=field):
        base_scorer(loaded, scoring_head_gguf=str(path))


def test_a_head_with_wrong_shapes_is_refused(drafter):
    root, loaded = drafter
    base = base_scorer(loaded)
    q, k = untrained_head_weights(base)
    path = save_scoring_head(root / "shape.gguf", base.head_identity(), np.concatenate([q, q]), k)
    with pytest.raises(ModelUnavailable, match="attn_q"):
        base_scorer(loaded, scoring_head_gguf=str(path))


def test_missing_head_file_and_legacy_selection_with_a_head_refuse_to_start(drafter, tmp_path):
    root, loaded = drafter
    with pytest.raises(ModelUnavailable, match="not found"):
        base_scorer(loaded, scoring_head_gguf=str(tmp_path / "missing.gguf"))
    with pytest.raises(ConfigError, match="strict selection"):
        base_scorer(loaded, scoring_head_gguf=str(root / "anything.gguf"), select_mode="legacy")


def test_a_head_for_another_scoring_layer_is_refused_naming_drafter_head_layer(drafter):
    root, loaded = drafter
    base = base_scorer(loaded)
    q, k = untrained_head_weights(base)
    ident = dataclasses.replace(
        base.head_identity(), feature_tap="post_block1_residual_before_block2"
    )
    path = save_scoring_head(root / "other-layer.gguf", ident, q, k)
    with pytest.raises(ModelUnavailable, match="feature_tap.*drafter_head_layer"):
        base_scorer(loaded, scoring_head_gguf=str(path))
