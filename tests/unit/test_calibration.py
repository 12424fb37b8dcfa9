"""Calibration files: the loader refuses what the scorer cannot use, the scorer applies the
calibrated layer and head weights, and `pflash calibrate`'s choices follow its stated rules.

Tiny random-weight llama models are saved to a temporary directory so they have weight
files to hash (`drafter_sha256`); the shipped SmolLM2 file is checked against the real model.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import UNTUNED

from pflash.compress.plan.query import QueryWindow
from pflash.compress.scoring import ScoreRequest
from pflash.config import build_config
from pflash.config.artefacts import resolve_artefact
from pflash.errors import ConfigError
from pflash.models.drafter.attention import (
    head_keys,
    head_queries,
    mix_window_masses,
    visible_keys,
    window_head_masses,
    window_mass,
)
from pflash.models.drafter.calibration import (
    SCHEMA,
    load_calibration,
    write_calibration,
)
from pflash.models.drafter.scorer import DrafterScorer
from pflash.models.drafter.scoring_head import drafter_sha256
from pflash.models.gguf_io import tiny_decoder
from pflash.models.loading import LoadedModel
from pflash.models.source import ModelSource
from pflash.spans import Span
from pflash_lab.corpus.needles import NeedlePrompt
from pflash_lab.train.calibrate import (
    Measured,
    choose_layer,
    chunk_masses,
    context_chunks,
    evidence_rank,
    head_weights_for,
    mixed_scores,
    needle_case,
    top_rank,
)

torch.set_num_threads(1)

WINDOWS = (QueryWindow(Span(60, 64), 1.0, "main"), QueryWindow(Span(40, 45), 1.0, "turn"))
QUERY = Span(60, 64)
N_LAYERS, N_HEADS = 4, 4  # tiny llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> LoadedModel:
    directory = tmp_path_factory.mktemp("tiny_llama")
    model = tiny_decoder("llama", layers=N_LAYERS)
    model.save_pretrained(directory)
    return LoadedModel(
        model, ModelSource("tiny", directory), None, 0.0, False, architecture="llama"
    )


def payload(sha: str, **kw) -> dict:
    return {
        "drafter_sha256": sha,
        "base_model": "tiny",
        "layer": 1,
        "head_weights": [0.5, 0.0, 0.25, 0.25],
    } | kw


def write(tmp_path: Path, data: dict, name: str = "cal.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def ids_of(n: int, seed: int = 0) -> tuple[int, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(0, 300, (n,), generator=g).tolist())


# --------------------------------------------------------------------------- the loader


def test_a_written_calibration_loads_with_weights_summing_to_one(tmp_path):
    path = write_calibration(tmp_path / "c.json", payload("abc", head_weights=[2, 0, 1, 1]))
    cal = load_calibration(path, "abc", N_LAYERS, N_HEADS)
    assert cal.layer == 1 and cal.drafter_sha256 == "abc"
    assert cal.head_weights == (0.5, 0.0, 0.25, 0.25)
    assert cal.extra["schema"] == SCHEMA


@pytest.mark.parametrize(
    "change, field",
    [
        ({"schema": "pflash_drafter_calibration_v0"}, "'schema'"),
        ({"drafter_sha256": "someone-else"}, "'drafter_sha256'"),
        ({"layer": 4}, "'layer'"),
        ({"layer": -1}, "'layer'"),
        ({"head_weights": [0.5, 0.5]}, "'head_weights'"),
        ({"head_weights": [0.5, -0.1, 0.3, 0.3]}, "'head_weights[1]'"),
        ({"head_weights": [0.5, math.nan, 0.3, 0.2]}, "'head_weights[1]'"),
        ({"head_weights": [0.5, math.inf, 0.3, 0.2]}, "'head_weights[1]'"),
        ({"head_weights": [0, 0, 0, 0]}, "'head_weights'"),
    ],
)
def test_a_calibration_the_scorer_cannot_use_is_refused_naming_the_field(tmp_path, change, field):
    data = {"schema": SCHEMA} | payload("abc") | change
    with pytest.raises(ConfigError, match=re.escape(field)) as err:
        load_calibration(write(tmp_path, data), "abc", N_LAYERS, N_HEADS)
    assert err.value.key == "drafter_calibration"


def test_a_missing_calibration_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="pflash calibrate"):
        load_calibration(tmp_path / "absent.json", "abc", N_LAYERS, N_HEADS)


def test_the_shipped_file_is_bound_to_the_embedded_drafter():
    from pflash.models.source import resolve_source

    sha = drafter_sha256(resolve_source("embedded:smollm2-135m").path)
    path = resolve_artefact("calibration", "embedded", "embedded:smollm2-135m")
    cal = load_calibration(path, sha, 30, 9)
    assert abs(sum(cal.head_weights) - 1) < 1e-9
    val = {r["scorer"]: r for r in cal.extra["validation"]["results"]}
    assert set(val) == {
        "plain mean, profile default layer",
        "plain mean, calibrated layer",
        "calibrated weights, calibrated layer",
    }


# --------------------------------------------------------------------------- the scorer


def calibrated_scorer(tiny, tmp_path, **config) -> DrafterScorer:
    path = write_calibration(tmp_path / "c.json", payload(drafter_sha256(tiny.source.path)))
    settings = {"drafter_chunk_tokens": 16, "drafter_calibration": str(path)}
    return DrafterScorer(build_config(UNTUNED | settings | config, env={}), tiny)


def test_calibrated_layer_and_head_weights_replace_the_plain_mean(tiny, tmp_path):
    scorer = calibrated_scorer(tiny, tmp_path)
    assert scorer.profile.head_layer == 1 and scorer.calibration.layer == 1
    ids = ids_of(80)
    result = scorer(ScoreRequest(ids=ids, windows=WINDOWS, query=QUERY))
    # by hand: per-head masses at layer 1 from an unchunked forward, weighted over heads
    captured = {}
    layer = tiny.model.model.layers[1]

    def grab(module, args, kwargs):
        captured["x"] = (args[0] if args else kwargs["hidden_states"])[0].float()

    handle = layer.register_forward_pre_hook(grab, with_kwargs=True)
    with torch.inference_mode():
        tiny.model.model(input_ids=torch.tensor([ids]))
        handle.remove()
        x = captured["x"]
        keys = head_keys(layer, x, n_kv=2)
        per_head, plain = [], []
        for w in WINDOWS:
            q = head_queries(layer, x[w.span.begin : w.span.end], n_head=N_HEADS, gated=False)
            vis = visible_keys(len(ids), QUERY, w, suffix_candidates=False)
            per_head.append(window_head_masses(q, keys, vis, scorer.scale))
            plain.append(window_mass(q, keys, vis, scorer.scale))
    heads = mix_window_masses(per_head, [1.0, 1.0]).numpy()  # [H, S]
    expected = np.array([0.5, 0.0, 0.25, 0.25]) @ heads
    np.testing.assert_allclose(result.mass, expected, atol=1e-6)
    np.testing.assert_allclose(result.mass.sum(), 1.0, atol=1e-5)
    uniform = mix_window_masses(plain, [1.0, 1.0]).numpy()
    np.testing.assert_allclose(heads.mean(axis=0), uniform, atol=1e-6)
    assert np.abs(result.mass - uniform).max() > 1e-4  # random tiny heads: near-uniform
    assert result.extras["calibration"] == str(tmp_path / "c.json")


def test_an_explicit_head_layer_that_disagrees_with_the_calibration_is_refused(tiny, tmp_path):
    with pytest.raises(ConfigError, match="calibration .* chose layer 1"):
        calibrated_scorer(tiny, tmp_path, drafter_head_layer=2)
    assert calibrated_scorer(tiny, tmp_path, drafter_head_layer=1).profile.head_layer == 1


def test_a_calibration_for_another_drafter_is_refused(tiny, tmp_path):
    path = write_calibration(tmp_path / "c.json", payload("0" * 64))
    config = build_config(UNTUNED | {"drafter_calibration": str(path)}, env={})
    with pytest.raises(ConfigError, match="drafter_sha256"):
        DrafterScorer(config, tiny)


def test_without_a_calibration_the_scorer_is_unchanged(tiny):
    scorer = DrafterScorer(build_config(UNTUNED | {"drafter_head_layer": 1}, env={}), tiny)
    assert scorer.calibration is None and scorer.head_weights is None
    result = scorer(ScoreRequest(ids=ids_of(80), windows=WINDOWS, query=QUERY))
    assert result.extras["calibration"] is None


# --------------------------------------------------------------------------- the command's rules


def test_calibration_measures_with_the_scorer_s_own_math(tiny):
    """The mean over heads of `chunk_masses` at the scoring layer is the scorer's mass
    summed over each context chunk, so a head's measured rank is what the scorer would see."""
    scorer = DrafterScorer(build_config(UNTUNED | {"drafter_head_layer": 2}, env={}), tiny)
    ids, query = ids_of(300, seed=4), Span(296, 300)
    windows = (QueryWindow(query, 1.0, "main"), QueryWindow(Span(280, 288), 1.0, "turn"))
    p = NeedlePrompt(ids, query, windows, context=Span(4, 270), needle=Span(100, 110))
    sums = chunk_masses(scorer, p, (1, 2))  # [layers, H, chunks]
    assert sums.shape == (2, N_HEADS, 5)
    mass = scorer(ScoreRequest(ids=ids, windows=windows, query=query)).mass
    expected = [mass[b:e].sum() for b, e in context_chunks(p)]
    np.testing.assert_allclose(sums[1].mean(axis=0), expected, atol=1e-6)
    assert np.abs(sums[0].mean(axis=0) - expected).max() > 1e-4  # layer 1 is another layer


def test_evidence_rank_is_the_best_evidence_chunk_with_ties_to_the_earlier_chunk():
    sums = np.array([[0.1, 0.4, 0.2, 0.3], [0.25, 0.25, 0.25, 0.25]])
    evidence = np.array([False, False, True, True])
    np.testing.assert_array_equal(evidence_rank(sums, evidence), [2, 3])
    assert top_rank(32) == 3 and top_rank(16) == 1


def test_head_weights_zero_heads_no_better_than_random_and_sum_to_one():
    w = head_weights_for(np.array([0.9, 0.1, 0.5, 0.3]), baseline=0.3)
    np.testing.assert_allclose(w, [0.6 / 0.8, 0.0, 0.2 / 0.8, 0.0])
    np.testing.assert_allclose(head_weights_for(np.array([0.1, 0.2]), 0.3), [0.5, 0.5])


def test_choose_layer_prefers_the_earlier_layer_on_a_near_tie():
    rows = [
        {"layer": 3, "weighted_top10": 0.50, "weighted_mrr": 0.60},
        {"layer": 5, "weighted_top10": 0.95, "weighted_mrr": 0.975},
        {"layer": 6, "weighted_top10": 1.00, "weighted_mrr": 0.97},
        {"layer": 9, "weighted_top10": 1.00, "weighted_mrr": 0.99},
    ]
    assert choose_layer(rows, n_prompts=20) == 5  # within 1/20 and 0.02 of layer 9
    assert choose_layer(rows, n_prompts=100) == 6  # 0.95 is more than one prompt behind


def test_mixed_scores_rank_the_weighted_mass():
    # 2 layers, 2 heads, 4 chunks; evidence in chunk 2; head 1 finds it, head 0 does not
    sums = np.zeros((2, 2, 4))
    sums[1, 0] = [0.7, 0.1, 0.1, 0.1]
    sums[1, 1] = [0.1, 0.1, 0.7, 0.1]
    m = [Measured(sums, np.array([False, False, True, False]))]
    assert mixed_scores(m, 1, np.array([0.0, 1.0]))[:2] == (1.0, 1.0)
    assert mixed_scores(m, 1, np.array([1.0, 0.0]))[:2] == (0.0, 1 / 3)  # ties: earlier first


def test_needle_case_evidence_span_holds_the_asked_needle(smollm2_tokenizer):
    p = needle_case(smollm2_tokenizer, "multi_key", seed=7, n_tokens=1024, source="licenses")
    text = smollm2_tokenizer.decode(p.ids[p.needle.begin : p.needle.end])
    question = smollm2_tokenizer.decode(p.ids[p.windows[1].span.begin : p.windows[1].span.end])
    key = text.split("special magic ")[1].split(" number")[0]
    assert text.strip().startswith("The special magic") and key in question
    assert p.context.begin < p.needle.begin < p.needle.end <= p.context.end < p.query.begin
    assert 900 <= len(p.ids) <= 1300


# --------------------------------------------------------------------------- the real drafter


@pytest.mark.model
def test_embedded_calibration_finds_the_needle_on_real_prose(smollm2_tokenizer):
    from pflash_lab.corpus.needles import needle_prompt, needle_rank

    scorer = DrafterScorer(build_config({"drafter_calibration": "embedded"}, env={}))
    assert scorer.profile.head_layer == scorer.calibration.layer
    p = needle_prompt(smollm2_tokenizer, 2048, 0.4, needle=1, offset=2500)
    result = scorer(ScoreRequest(ids=p.ids, windows=p.windows, query=p.query))
    rank, chunks = needle_rank(result.mass, p, chunk=64)
    assert rank <= chunks // 10, f"needle chunk ranked {rank} of {chunks}"
