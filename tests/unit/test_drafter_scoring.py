"""Head and legacy scorer math against naive references from transformers' own forward.

Tiny random-weight llama, qwen3 and qwen3_5 models. The references run the whole model
unchunked with eager attention and read Q/K before rotary with hooks on the modules the
modeling files name (q_norm/k_norm, or q_proj/k_proj without them), or read the post-RoPE
probabilities from `output_attentions` (qwen35 legacy, §3.2). The scorer under test runs
early-exit, chunked, with a KV cache, and must give the same numbers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import UNTUNED

from pflash.compress.plan.query import QueryWindow
from pflash.compress.scoring import ScoreRequest, candidate_lifts
from pflash.config import DrafterScorerPart, build_config
from pflash.errors import CompressionFailed, ConfigError
from pflash.models.drafter import attention
from pflash.models.drafter import scorer as drafter_mod
from pflash.models.drafter.attention import mean_head_mass, smooth_in_range
from pflash.models.drafter.profile import GENERIC_HEAD_FRACTION, resolve_profile
from pflash.models.drafter.scorer import DrafterScorer
from pflash.models.gguf_io import tiny_decoder
from pflash.models.loading import LoadedModel
from pflash.models.source import ModelSource
from pflash.spans import Span

torch.set_num_threads(1)

ARCH = {"llama": "llama", "qwen3": "qwen3", "qwen3_5": "qwen35"}
HEAD_LAYER = {"llama": 2, "qwen3": 2, "qwen3_5": 7}  # qwen3_5: 8 layers, full attention at 3 and 7
LAYERS = {"llama": 4, "qwen3": 4, "qwen3_5": 8}


def loaded_tiny(kind: str, **kw) -> LoadedModel:
    model = tiny_decoder(kind, layers=LAYERS[kind], **kw)
    return LoadedModel(
        model, ModelSource("tiny", Path(".")), None, 0.0, False, architecture=ARCH[kind]
    )


def make_scorer(kind: str, **config) -> DrafterScorer:
    settings = {
        "drafter_head_layer": HEAD_LAYER[kind],
        "drafter_chunk_tokens": 16,
        "legacy_query_tokens": 6,
    }
    return DrafterScorer(build_config(UNTUNED | settings | config, env={}), loaded_tiny(kind))


@pytest.fixture(scope="module", params=["llama", "qwen3", "qwen3_5"])
def scorer(request) -> DrafterScorer:
    return make_scorer(request.param)


def random_ids(n: int, seed: int = 0) -> tuple[int, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(0, 300, (n,), generator=g).tolist())


WINDOWS = (
    QueryWindow(Span(60, 64), 1.0, "main"),
    QueryWindow(Span(40, 45), 1.0, "turn"),
    QueryWindow(Span(10, 12), 0.5, "history"),
)


# --------------------------------------------------------------------------- references


def capture_nope_qk(model, ids, layers):
    """Run the full model (eager, unchunked) and return pre-rotary Q/K of `layers`, and the
    post-RoPE attention probabilities of every attention layer."""
    caps, handles = {}, []
    for i in layers:
        attn = model.model.layers[i].self_attn
        qm = attn.q_norm if hasattr(attn, "q_norm") else attn.q_proj
        km = attn.k_norm if hasattr(attn, "k_norm") else attn.k_proj
        handles.append(
            qm.register_forward_hook(lambda m, a, o, i=i: caps.__setitem__(("q", i), o[0].detach()))
        )
        handles.append(
            km.register_forward_hook(lambda m, a, o, i=i: caps.__setitem__(("k", i), o[0].detach()))
        )
    impl = model.config._attn_implementation
    model.config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            out = model(torch.tensor([ids]), output_attentions=True)
    finally:
        model.config._attn_implementation = impl
        for h in handles:
            h.remove()
    cfg = model.config
    s = len(ids)
    qk = {
        i: (
            caps[("q", i)].reshape(s, cfg.num_attention_heads, -1).double().numpy(),
            caps[("k", i)].reshape(s, cfg.num_key_value_heads, -1).double().numpy(),
        )
        for i in layers
    }
    return qk, [a[0].double().numpy() for a in out.attentions if a is not None]


def naive_head_mass(model, ids, layer, windows, query, suffix=False):
    """§3.3 by the letter: per window, per head and row, softmax over visible keys, mean."""
    qk, _ = capture_nope_qk(model, ids, [layer])
    q, k = qk[layer]
    n_head, n_kv = q.shape[1], k.shape[1]
    scale = model.model.layers[layer].self_attn.scaling
    s = len(ids)
    total, weight = np.zeros(s), 0.0
    for w in windows:
        visible = np.zeros(s, bool)
        visible[: query.begin] = True
        if suffix:
            visible[query.end :] = True
        if w.kind != "main":
            visible[w.span.begin : w.span.end] = False
        mass = np.zeros(s)
        for h in range(n_head):
            for t in range(w.span.begin, w.span.end):
                z = k[:, h // (n_head // n_kv)] @ q[t, h] * scale
                z[~visible] = -np.inf
                p = np.exp(z - z.max())
                mass += p / p.sum()
        total += w.weight * mass / (n_head * len(w.span))
        weight += w.weight
    return total / weight


def naive_legacy(model, ids, query, n_rows, kernel, post_rope):
    """§3.1/§3.2: running max over layers and heads, mean over tail rows, in-range mean."""
    types = (
        getattr(model.config, "layer_types", None)
        or ["full_attention"] * model.config.num_hidden_layers
    )
    layers = [i for i, t in enumerate(types) if t != "linear_attention"]
    qk, attentions = capture_nope_qk(model, ids, layers)
    s, r0 = len(ids), query.end - n_rows
    running = np.full((n_rows, s), -np.inf)
    for li, i in enumerate(layers):
        if post_rope:
            probs = attentions[li][:, r0 : query.end]  # [H, n, S], causal already
        else:
            q, k = qk[i]
            n_head, n_kv = q.shape[1], k.shape[1]
            probs = np.zeros((n_head, n_rows, s))
            for h in range(n_head):
                for t in range(n_rows):
                    z = (
                        k[:, h // (n_head // n_kv)]
                        @ q[r0 + t, h]
                        * model.model.layers[i].self_attn.scaling
                    )
                    z[r0 + t + 1 :] = -np.inf
                    p = np.exp(z - z.max())
                    probs[h, t] = p / p.sum()
        running = np.maximum(running, probs.max(axis=0))
    score = running.mean(axis=0)
    r = kernel // 2
    return np.array([score[max(0, j - r) : min(s, j + r + 1)].mean() for j in range(s)])


# --------------------------------------------------------------------------- head mass


def test_head_mass_mean_matches_reference_test_vector():
    # §3.3 step 6 / §10.1 item 18: [H=2, rows=2, keys=3]
    probs = torch.tensor([[[0.2, 0.3, 0.5], [0.6, 0.4, 0.0]], [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]])
    np.testing.assert_allclose(mean_head_mass(probs).numpy(), [0.45, 0.175, 0.375], atol=1e-7)


def test_calibrated_head_weights_make_the_head_mean_a_weighted_mean():
    # per-head row means: h0 [.4, .35, .25], h1 [.5, 0, .5]
    probs = torch.tensor([[[0.2, 0.3, 0.5], [0.6, 0.4, 0.0]], [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]])
    one_hot = mean_head_mass(probs, torch.tensor([1.0, 0.0])).numpy()
    np.testing.assert_allclose(one_hot, [0.4, 0.35, 0.25], atol=1e-7)
    mixed = mean_head_mass(probs, torch.tensor([0.25, 0.75])).numpy()
    np.testing.assert_allclose(mixed, [0.475, 0.0875, 0.4375], atol=1e-7)
    equal = mean_head_mass(probs, torch.tensor([0.5, 0.5])).numpy()
    np.testing.assert_allclose(equal, mean_head_mass(probs).numpy(), atol=1e-7)


def test_a_window_softmaxed_at_once_gives_the_mass_of_two_passes_over_key_blocks(monkeypatch):
    # a later turn's few rows over many key blocks: all logits at once vs two streamed passes
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(12, 6, 16, generator=gen)  # [n, H, D]
    keys = torch.randn(5000, 2, 16, generator=gen)  # [S, Hk, D]
    visible = torch.ones(5000, dtype=torch.bool)
    visible[4000:4100] = False
    monkeypatch.setattr(attention, "KEY_BLOCK_ELEMENTS", 6 * 12 * 256)  # 20 key blocks
    held = attention.window_mass(q, keys, visible, 0.25)
    monkeypatch.setattr(attention, "HELD_LOGITS", 0)
    streamed = attention.window_mass(q, keys, visible, 0.25)
    torch.testing.assert_close(held, streamed, rtol=1e-5, atol=1e-9)
    assert float(held[4000:4100].abs().sum()) == 0.0
    assert abs(float(held.sum()) - 1.0) < 1e-5


def test_visible_runs_are_the_maximal_runs_of_the_key_mask():
    visible = torch.tensor([1, 1, 0, 0, 1, 0, 1, 1, 1], dtype=torch.bool)
    assert attention.visible_runs(visible) == [(0, 2), (4, 5), (6, 9)]
    assert attention.visible_runs(torch.zeros(4, dtype=torch.bool)) == []
    assert attention.visible_runs(torch.ones(3, dtype=torch.bool)) == [(0, 3)]


def test_a_non_finite_key_fails_the_window_as_non_finite_scores(monkeypatch):
    q = torch.ones(3, 2, 4)
    keys = torch.ones(50, 1, 4)
    keys[10, 0, 0] = float("nan")
    visible = torch.ones(50, dtype=torch.bool)
    for held in (1 << 24, 0):
        monkeypatch.setattr(attention, "HELD_LOGITS", held)
        with pytest.raises(attention.NonFiniteScores):
            attention.window_mass(q, keys, visible, 0.5)


@pytest.mark.parametrize("suffix", [False, True])
def test_head_mass_equals_eager_reference(scorer, suffix):
    ids = random_ids(70)
    query = WINDOWS[0].span
    got = scorer(ScoreRequest(ids=ids, windows=WINDOWS, query=query, suffix_candidates=suffix))
    want = naive_head_mass(scorer.model, ids, scorer.profile.head_layer, WINDOWS, query, suffix)
    np.testing.assert_allclose(got.mass, want, atol=1e-6)
    assert got.mass.dtype == np.float32 and got.scorer_new_tokens == 70


def test_candidate_lifts_equal_reference_lifts(scorer):
    ids = random_ids(70, seed=3)
    query = WINDOWS[0].span
    got = scorer(ScoreRequest(ids=ids, windows=WINDOWS, query=query))
    want = naive_head_mass(scorer.model, ids, scorer.profile.head_layer, WINDOWS, query)
    chunks = [Span(b, min(b + 16, 70)) for b in range(0, 70, 16)]
    for (span, lift), (_, ref) in zip(
        candidate_lifts(got.mass, chunks), candidate_lifts(want, chunks), strict=True
    ):
        assert lift == pytest.approx(ref, abs=1e-4), span


def test_masked_keys_get_zero_mass_and_visible_keys_sum_to_one(scorer):
    ids = random_ids(70, seed=1)
    query = Span(50, 58)
    window = (QueryWindow(query, 1.0, "main"),)
    mass = scorer(ScoreRequest(ids=ids, windows=window, query=query)).mass
    assert mass[50:].sum() == 0.0  # the main window and everything after it are masked
    assert mass[:50].sum() == pytest.approx(1.0, abs=1e-5)
    with_suffix = scorer(
        ScoreRequest(ids=ids, windows=window, query=query, suffix_candidates=True)
    ).mass
    assert with_suffix[50:58].sum() == 0.0 and with_suffix[58:].sum() > 0.0
    assert with_suffix.sum() == pytest.approx(1.0, abs=1e-5)


def test_turn_window_never_scores_its_own_tokens(scorer):
    ids = random_ids(70, seed=2)
    query = Span(69, 70)
    turn = Span(30, 38)
    only_turn = scorer(
        ScoreRequest(ids=ids, windows=(QueryWindow(turn, 1.0, "turn"),), query=query)
    ).mass
    assert only_turn[30:38].sum() == 0.0 and only_turn[69] == 0.0
    assert only_turn[38:69].sum() > 0.0  # NoPE: a history or turn window sees keys after it


def test_tap_is_the_hidden_state_entering_the_scoring_layer(scorer):
    ids = random_ids(40, seed=4)
    query = Span(39, 40)
    got = scorer(
        ScoreRequest(
            ids=ids, windows=(QueryWindow(query, 1.0, "main"),), query=query, want_tap=True
        )
    )
    with torch.no_grad():
        hidden = scorer.model.model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    np.testing.assert_allclose(got.tap, hidden[scorer.profile.head_layer][0].numpy(), atol=1e-5)


def test_layers_after_the_scoring_layer_are_never_computed(scorer):
    ran = []
    layers = scorer.model.model.layers
    handles = [
        layer.register_forward_hook(lambda m, a, o, i=i: ran.append(i))
        for i, layer in enumerate(layers)
    ]
    try:
        query = Span(49, 50)
        scorer(
            ScoreRequest(
                ids=random_ids(50), windows=(QueryWindow(query, 1.0, "main"),), query=query
            )
        )
    finally:
        for h in handles:
            h.remove()
    assert set(ran) == set(range(scorer.profile.head_layer))
    assert len(ran) == scorer.profile.head_layer * 4  # 50 tokens in chunks of 16: 4 chunks


# --------------------------------------------------------------------------- legacy scorer


def test_legacy_scores_equal_reference(scorer):
    ids = random_ids(70, seed=5)
    query = Span(60, 68)
    got = scorer(
        ScoreRequest(
            ids=ids, windows=(QueryWindow(query, 1.0, "main"),), query=query, scorer="legacy"
        )
    )
    post_rope = scorer.profile.name == "qwen35"
    want = naive_legacy(scorer.model, ids, query, 6, 13, post_rope)
    assert got.mass is None
    np.testing.assert_allclose(got.legacy, want, atol=1e-6)


def test_split_scorer_returns_head_mass_and_legacy_scores_from_one_forward(scorer):
    ids = random_ids(70, seed=6)
    query = WINDOWS[0].span
    split = scorer(ScoreRequest(ids=ids, windows=WINDOWS, query=query, scorer="split"))
    head = scorer(ScoreRequest(ids=ids, windows=WINDOWS, query=query))
    legacy = scorer(ScoreRequest(ids=ids, windows=WINDOWS, query=query, scorer="legacy"))
    np.testing.assert_allclose(split.mass, head.mass, atol=1e-7)
    np.testing.assert_allclose(split.legacy, legacy.legacy, atol=1e-7)


def test_scorer_given_only_its_part_scores_like_the_whole_config():
    """The DrafterScorer deployment holds only DrafterScorerPart (scoring, selection, legacy)."""
    config = build_config(UNTUNED | {"drafter_head_layer": 2, "drafter_chunk_tokens": 16}, env={})
    whole = DrafterScorer(config, loaded_tiny("llama"))
    part = DrafterScorer(config.part(DrafterScorerPart), whole.loaded)
    assert part.profile == whole.profile == resolve_profile(whole.loaded, config.scoring)
    ids = random_ids(70, seed=7)
    request = ScoreRequest(ids=ids, windows=WINDOWS, query=WINDOWS[0].span, scorer="split")
    got, want = part(request), whole(request)
    np.testing.assert_array_equal(got.mass, want.mass)
    np.testing.assert_array_equal(got.legacy, want.legacy)


def test_in_range_smoothing_divides_by_valid_neighbours_only():
    score = torch.tensor([3.0, 0.0, 0.0, 0.0, 6.0])
    np.testing.assert_allclose(smooth_in_range(score, 3).numpy(), [1.5, 1.0, 0.0, 2.0, 3.0])
    np.testing.assert_allclose(smooth_in_range(score, 1).numpy(), score.numpy())


# --------------------------------------------------------------------------- failures


def test_non_finite_scores_fail_naming_the_drafter_after_one_rescore():
    scorer = make_scorer("llama")
    with torch.no_grad():
        scorer.layer.self_attn.k_proj.weight[0, 0] = float("nan")
    query = Span(39, 40)
    with pytest.raises(CompressionFailed, match="non-finite") as err:
        scorer(
            ScoreRequest(
                ids=random_ids(40), windows=(QueryWindow(query, 1.0, "main"),), query=query
            )
        )
    assert err.value.stage == "drafter"


def test_one_non_finite_result_is_rescored_from_scratch(monkeypatch):
    scorer = make_scorer("llama")
    real, calls = drafter_mod.window_mass, []

    def flaky(*args):
        calls.append(1)
        if len(calls) == 1:
            raise drafter_mod.NonFiniteScores("non-finite probabilities (injected)")
        return real(*args)

    monkeypatch.setattr(drafter_mod, "window_mass", flaky)
    query = Span(39, 40)
    got = scorer(
        ScoreRequest(
            ids=random_ids(40),
            windows=(QueryWindow(query, 1.0, "main"),),
            query=query,
            session_key="c",
        )
    )
    assert got.extras["rescored"] is True and got.mass.sum() == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize(
    "query, message",
    [(Span(0, 1), "no visible keys"), (Span(38, 42), "out of range"), (Span(5, 5), "out of range")],
)
def test_bad_query_windows_fail_closed(scorer, query, message):
    with pytest.raises(CompressionFailed, match=message):
        scorer(
            ScoreRequest(
                ids=random_ids(40), windows=(QueryWindow(query, 1.0, "main"),), query=query
            )
        )


# --------------------------------------------------------------------------- profiles


def test_profiles_state_head_layer_tap_and_legacy_layers():
    q35 = resolve_profile(loaded_tiny("qwen3_5"), build_config(UNTUNED, env={}))
    assert (q35.name, q35.head_layer, q35.legacy_layers, q35.legacy_rope, q35.gated_q) == (
        "qwen35",
        7,
        (3, 7),
        True,
        True,
    )
    assert q35.tap == "post_block6_residual_before_block7"
    qwen3 = resolve_profile(loaded_tiny("qwen3"), build_config(UNTUNED, env={}))
    assert (qwen3.name, qwen3.head_layer, qwen3.legacy_rope) == (
        "qwen3",
        2,
        False,
    )  # round(13 * 4 / 28)
    generic = resolve_profile(loaded_tiny("llama"), build_config(UNTUNED, env={}))
    assert generic.name == "generic" and generic.head_layer == round(GENERIC_HEAD_FRACTION * 4)
    assert generic.schema.endswith("_nope_qk_mass_v1")


def test_qwen35_head_layer_must_be_a_full_attention_layer():
    with pytest.raises(ConfigError, match="drafter_head_layer"):
        resolve_profile(loaded_tiny("qwen3_5"), build_config({"drafter_head_layer": 5}, env={}))


def test_chunks_cover_the_new_tokens_and_cut_at_the_checkpoint():
    assert attention.chunk_bounds(10, 50, 16) == [(10, 26), (26, 42), (42, 50)]
    assert attention.chunk_bounds(10, 50, 16, cuts=(30,)) == [
        (10, 26),
        (26, 30),
        (30, 42),
        (42, 50),
    ]
    assert attention.chunk_bounds(50, 50, 16) == []


def test_concurrent_requests_score_as_if_one_after_the_other():
    # Serve runs the deployment's sync `score` on a thread pool: two passes at once used to
    # share the tap hook, and one ended with KeyError 'x' (a 500 under concurrent load)
    from concurrent.futures import ThreadPoolExecutor

    scorer = make_scorer("llama")
    requests = [
        ScoreRequest(ids=random_ids(70, seed=s), windows=WINDOWS, query=WINDOWS[0].span)
        for s in range(6)
    ]
    alone = [scorer(r).mass for r in requests]
    with ThreadPoolExecutor(max_workers=3) as pool:
        together = list(pool.map(lambda r: scorer(r).mass, requests))
    for a, b in zip(alone, together, strict=True):
        np.testing.assert_array_equal(a, b)
