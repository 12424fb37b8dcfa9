"""Windowed drafter attention: sink + sliding window below the scoring layer.

Tiny random-weight llama, qwen3 and qwen3_5 models. A window covering the prompt gives the
dense scores; a small window gives what one unchunked forward under the same mask gives
(so chunking and eviction lose nothing); the windowed KV cache stays bounded at 32K tokens;
sessions resume on a windowed cache exactly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import UNTUNED

from pflash.compress.plan.query import QueryWindow
from pflash.compress.scoring import ScoreRequest
from pflash.config import build_config
from pflash.models.drafter.scorer import DrafterScorer
from pflash.models.drafter.sessions import DrafterSession, plan_resume
from pflash.models.drafter.window import WindowSpec, window_layers, window_mask
from pflash.models.gguf_io import tiny_decoder
from pflash.models.loading import LoadedModel
from pflash.models.source import ModelSource
from pflash.spans import Span

torch.set_num_threads(1)

ARCH = {"llama": "llama", "qwen3": "qwen3", "qwen3_5": "qwen35"}
HEAD_LAYER = {"llama": 2, "qwen3": 2, "qwen3_5": 7}  # qwen3_5: full attention at 3 and 7
LAYERS = {"llama": 4, "qwen3": 4, "qwen3_5": 8}
_MODELS: dict[str, LoadedModel] = {}


def loaded_tiny(kind: str) -> LoadedModel:
    if kind not in _MODELS:
        model = tiny_decoder(kind, layers=LAYERS[kind], seed=5)
        _MODELS[kind] = LoadedModel(
            model, ModelSource("tiny", Path(".")), None, 0.0, False, architecture=ARCH[kind]
        )
    return _MODELS[kind]


def make_scorer(kind: str, **config) -> DrafterScorer:
    settings = {
        "drafter_head_layer": HEAD_LAYER[kind],
        "drafter_chunk_tokens": 16,
        "drafter_attention": "dense",  # the reference; `windowed` asks for the window
        # the masked-forward reference reads the sinks where they are; `adjacent` (the
        # default) has its own tests in test_drafter_sink_positions.py
        "drafter_sink_positions": "absolute",
    }
    return DrafterScorer(build_config(UNTUNED | settings | config, env={}), loaded_tiny(kind))


def windowed(kind: str, *, window: int, sink: int, **config) -> DrafterScorer:
    return make_scorer(
        kind,
        drafter_attention="window",
        drafter_window_tokens=window,
        drafter_sink_tokens=sink,
        **config,
    )


def random_ids(n: int, seed: int = 0) -> tuple[int, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(0, 300, (n,), generator=g).tolist())


def request(n: int, *, seed: int = 0, key: str | None = None, tap: bool = True) -> ScoreRequest:
    windows = (
        QueryWindow(Span(n - 4, n), 1.0, "main"),
        QueryWindow(Span(n - 30, n - 24), 1.0, "turn"),
    )
    return ScoreRequest(
        ids=random_ids(n, seed),
        windows=windows,
        query=Span(n - 4, n),
        session_key=key,
        want_tap=tap,
    )


# --------------------------------------------------------------------------- the mask rule


def test_window_mask_keeps_sinks_and_the_last_window_keys_causally():
    spec = WindowSpec(sink=2, window=3)
    got = window_mask(torch.arange(7), torch.arange(7), spec).int().tolist()
    assert got[6] == [1, 1, 0, 0, 1, 1, 1]  # sinks 0,1 + positions 4,5,6
    assert got[3] == [1, 1, 1, 1, 0, 0, 0]  # all of 0..3: the window reaches the sinks
    assert got[0] == [1, 0, 0, 0, 0, 0, 0]  # causal
    assert WindowSpec(sink=2, window=3, slack=5).cache_bound(16) == 2 + 2 + 5 + 16


# --------------------------------------------------------------------------- equal to dense


@pytest.mark.parametrize("kind", ["llama", "qwen3", "qwen3_5"])
def test_a_window_covering_the_prompt_gives_the_dense_scores(kind):
    req = request(90)
    dense = make_scorer(kind)(req)
    win = windowed(kind, window=4096, sink=4)(req)
    assert win.extras["drafter_attention"] == "window"
    assert dense.extras["drafter_attention"] == "dense"
    np.testing.assert_allclose(win.mass, dense.mass, atol=1e-6, rtol=0)
    np.testing.assert_allclose(win.tap, dense.tap, atol=1e-5, rtol=0)


def masked_reference_tap(model, ids, layer: int, spec: WindowSpec) -> np.ndarray:
    """One unchunked, uncached forward under the window mask (eager attention): the hidden
    states entering `layer`. No cache eviction can happen here."""
    captured = {}
    decoder = model.model
    handle = decoder.layers[layer].register_forward_pre_hook(
        lambda m, args, kwargs: captured.__setitem__(
            "x", args[0] if args else kwargs["hidden_states"]
        ),
        with_kwargs=True,
    )
    pos = torch.arange(len(ids))
    allowed = window_mask(pos, pos, spec)[None, None]
    mask = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)
    impl = model.config._attn_implementation
    model.config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            decoder(input_ids=torch.tensor([ids]), attention_mask=mask, use_cache=False)
    finally:
        model.config._attn_implementation = impl
        handle.remove()
    return captured["x"][0].float().numpy()


@pytest.mark.parametrize("kind", ["llama", "qwen3_5"])
def test_a_small_window_equals_one_masked_forward_and_differs_from_dense(kind):
    # chunk 16 < window 24: every chunk evicts; the reference never evicts anything
    req = request(120, seed=3)
    scorer = windowed(kind, window=24, sink=4)
    got = scorer(req)
    spec = WindowSpec(sink=4, window=24)
    want = masked_reference_tap(scorer.model, req.ids, HEAD_LAYER[kind], spec)
    np.testing.assert_allclose(got.tap, want, atol=1e-5, rtol=0)
    dense = make_scorer(kind)(req)
    assert np.abs(got.tap - dense.tap).max() > 1e-3  # the window really cut something


# --------------------------------------------------------------------------- bounded at 32K


def test_a_32k_prompt_scores_with_a_bounded_windowed_cache():
    spec = dict(window=256, sink=8)
    chunk = 512
    held = {}
    for n in (4096, 32768):
        scorer = windowed("llama", **spec, drafter_chunk_tokens=chunk)
        result = scorer(request(n, key="long", tap=False))
        assert result.mass.shape == (n,) and np.isfinite(result.mass).all()
        assert abs(float(result.mass.sum()) - 1.0) < 1e-3
        layers = window_layers(scorer.sessions.get("long").cache)
        ran = [layer for layer in layers if layer.is_initialized]
        assert len(ran) == HEAD_LAYER["llama"]  # only the layers below the scoring layer ran
        bound = scorer.window.cache_bound(chunk)
        for layer in ran:
            assert layer.seen == n
            assert layer.peak <= bound
            assert layer.held() <= scorer.window.sink + scorer.window.tail
            assert tuple(layer.keys.shape[-2:-1]) == (layer.held(),)
        held[n] = max(layer.peak for layer in ran)
    assert held[32768] == held[4096]  # the cache does not grow with the prompt


# --------------------------------------------------------------------------- sessions


def turns(kind: str):
    main, turn = QueryWindow(Span(199, 200), 1.0, "main"), QueryWindow(Span(180, 188), 1.0, "turn")
    one = ScoreRequest(
        ids=random_ids(200, 1),
        windows=(main, turn),
        query=main.span,
        session_key="conv",
        want_tap=True,
    )
    # turn one minus its last 3 tokens (the generation prompt), then 60 new tokens
    ids = one.ids[:197] + random_ids(60, 2)
    windows = (
        QueryWindow(Span(256, 257), 1.0, "main"),
        QueryWindow(Span(240, 248), 1.0, "turn"),
        QueryWindow(Span(199, 200), 0.5, "history"),
    )
    two = ScoreRequest(
        ids=ids, windows=windows, query=Span(256, 257), session_key="conv", want_tap=True
    )
    return one, two


@pytest.mark.parametrize("kind", ["llama", "qwen3_5"])
def test_a_resumed_turn_on_a_windowed_cache_scores_like_a_fresh_windowed_pass(kind):
    one, two = turns(kind)
    scorer = windowed(kind, window=48, sink=4, drafter_chunk_tokens=32)
    scorer(one)
    resumed = scorer(two)
    # llama crops back to the shared 197; qwen3_5 restores its checkpoint at 200 - 64
    assert resumed.scorer_resume == (197 if kind == "llama" else 136)
    assert resumed.extras["skipped_windows"] == []
    fresh = windowed(kind, window=48, sink=4, drafter_chunk_tokens=32)(
        ScoreRequest(**{**two.__dict__, "session_key": None})
    )
    np.testing.assert_allclose(resumed.mass, fresh.mass, atol=1e-6, rtol=0)
    np.testing.assert_allclose(resumed.tap, fresh.tap, atol=1e-5, rtol=0)


def test_a_windowed_session_never_rewinds_past_what_it_evicted():
    scorer = windowed("llama", window=48, sink=4, drafter_chunk_tokens=32)
    one = request(200, seed=1, key="conv")
    scorer(one)
    cache = scorer.sessions.get("conv").cache
    floor = max(layer.resume_floor() for layer in window_layers(cache))
    assert floor == 200 - 64  # the slack: as far back as a recurrent checkpoint
    ids = one.ids[:100] + random_ids(50, 4)
    two = ScoreRequest(
        ids=ids,
        windows=(QueryWindow(Span(149, 150), 1.0, "main"),),
        query=Span(149, 150),
        session_key="conv",
    )
    again = scorer(two)
    assert again.scorer_resume == 0  # 100 < floor: from scratch
    fresh = windowed("llama", window=48, sink=4)(
        ScoreRequest(**{**two.__dict__, "session_key": None})
    )
    np.testing.assert_allclose(again.mass, fresh.mass, atol=1e-6, rtol=0)


def test_plan_resume_respects_a_windowed_floor():
    s = DrafterSession(
        ids=tuple(range(100)), cache=None, keys=torch.zeros(100, 1, 1), keys_from_head=False
    )
    windows = (QueryWindow(Span(119, 120), 1.0, "main"),)
    ids = tuple(range(90)) + tuple(range(500, 530))
    kw = dict(croppable=True, want_tap=False, keys_from_head=False)
    assert plan_resume(s, ids, windows, **kw, floor=80).resume == 90
    assert plan_resume(s, ids, windows, **kw, floor=95).resume == 0
    longer = tuple(range(100)) + (7,) * 20
    assert plan_resume(s, longer, windows, **kw, floor=99).resume == 100
