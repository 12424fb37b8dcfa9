"""Look-ahead queries (SpecPrefill's trick, §3.6): decoded tokens' rows join the query windows.

Tiny random-weight models check the mix against a reference built by hand from an unchunked,
cache-free forward over the prompt plus the greedily decoded tokens; the embedded SmolLM2
checks the decoded tokens against `model.generate(do_sample=False)`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pflash.compress.query import QueryWindow
from pflash.compress.scoring import ScoreRequest
from pflash.config import build_config
from pflash.models.drafter.attention import (
    head_keys,
    head_queries,
    mix_window_masses,
    visible_keys,
    window_mass,
)
from pflash.models.drafter.scorer import DrafterScorer
from pflash.models.gguf_io import tiny_decoder
from pflash.models.loading import LoadedModel
from pflash.models.source import ModelSource
from pflash.spans import Span

torch.set_num_threads(1)

ARCH = {"llama": "llama", "qwen3": "qwen3", "qwen3_5": "qwen35"}
HEAD_LAYER = {"llama": 2, "qwen3": 2, "qwen3_5": 7}
LAYERS = {"llama": 4, "qwen3": 4, "qwen3_5": 8}
WINDOWS = (QueryWindow(Span(60, 64), 1.0, "main"), QueryWindow(Span(40, 45), 1.0, "turn"))
QUERY = Span(60, 64)


def loaded_tiny(kind: str) -> LoadedModel:
    model = tiny_decoder(kind, layers=LAYERS[kind])
    return LoadedModel(
        model, ModelSource("tiny", Path(".")), None, 0.0, False, architecture=ARCH[kind]
    )


def make_scorer(kind: str, loaded: LoadedModel | None = None, **config) -> DrafterScorer:
    settings = {"drafter_head_layer": HEAD_LAYER[kind], "drafter_chunk_tokens": 16}
    return DrafterScorer(build_config(settings | config, env={}), loaded or loaded_tiny(kind))


def random_ids(n: int, seed: int = 0) -> tuple[int, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(0, 300, (n,), generator=g).tolist())


def request(ids, **kw) -> ScoreRequest:
    return ScoreRequest(ids=ids, windows=WINDOWS, query=QUERY, **kw)


def greedy_by_full_forwards(model, ids, k: int) -> list[int]:
    """Reference greedy decoding: one cache-free forward over everything per token."""
    seq = list(ids)
    with torch.inference_mode():
        for _ in range(k):
            seq.append(int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(ids) :]


def scoring_layer_inputs(model, ids, layer: int) -> torch.Tensor:
    """The hidden states entering `layer` for every token of `ids`, one unchunked forward."""
    captured = {}

    def grab(module, args, kwargs):
        captured["x"] = (args[0] if args else kwargs["hidden_states"])[0].float()

    handle = model.model.layers[layer].register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with torch.inference_mode():
            model.model(input_ids=torch.tensor([ids]))
    finally:
        handle.remove()
    return captured["x"]  # [len(ids), hidden]


def reference_mass(scorer, ids, tokens, weight: float) -> tuple[np.ndarray, np.ndarray]:
    """(mass with the look-ahead window, mass of the look-ahead window alone), by hand."""
    model, layer = scorer.model, scorer.layer
    x = scoring_layer_inputs(model, tuple(ids) + tuple(tokens), scorer.profile.head_layer)
    s = len(ids)
    with torch.inference_mode():
        keys = head_keys(layer, x[:s], n_kv=scorer.n_kv)
        gated = scorer.profile.gated_q
        masses, weights = [], []
        for w in WINDOWS:
            q = head_queries(layer, x[w.span.begin : w.span.end], n_head=scorer.n_head, gated=gated)
            vis = visible_keys(s, QUERY, w, suffix_candidates=False)
            masses.append(window_mass(q, keys, vis, scorer.scale))
            weights.append(w.weight)
        q = head_queries(layer, x[s:], n_head=scorer.n_head, gated=gated)  # the decoded rows
        vis = visible_keys(s, QUERY, WINDOWS[0], suffix_candidates=False)
        ahead = window_mass(q, keys, vis, scorer.scale)
    mixed = mix_window_masses(masses + [ahead], weights + [weight])
    return mixed.numpy(), ahead.numpy()


@pytest.mark.parametrize("kind", ["llama", "qwen3", "qwen3_5"])
def test_lookahead_window_uses_the_decoded_tokens_scoring_layer_rows(kind):
    loaded = loaded_tiny(kind)
    ids = random_ids(80)
    k, weight = 4, 2.0
    ahead = make_scorer(kind, loaded, drafter_lookahead_tokens=k, drafter_lookahead_weight=weight)(
        request(ids)
    )
    plain = make_scorer(kind, loaded)(request(ids))
    tokens = ahead.extras["lookahead_tokens"]
    assert tokens == greedy_by_full_forwards(loaded.model, ids, k)
    expected, alone = reference_mass(make_scorer(kind, loaded), ids, tokens, weight)
    np.testing.assert_allclose(ahead.mass, expected, atol=2e-6)
    # the look-ahead rows matter: the mix moved from the plain mass toward the window's own
    assert np.abs(ahead.mass - plain.mass).max() > 1e-3
    np.testing.assert_allclose(
        ahead.mass, (2 * plain.mass + weight * alone) / (2 + weight), atol=2e-6
    )
    assert ahead.mass[QUERY.begin :].sum() == 0.0  # decoded tokens and the query stay unseen
    assert ahead.extras["windows"] == 3 and ahead.extras["lookahead_ms"] >= 0.0
    assert ahead.scorer_new_tokens == len(ids) and ahead.scorer_resume == 0


def test_lookahead_zero_is_the_plain_scorer():
    loaded = loaded_tiny("llama")
    ids = random_ids(80, seed=3)
    off = make_scorer("llama", loaded, drafter_lookahead_tokens=0)(request(ids))
    default = make_scorer("llama", loaded)(request(ids))
    np.testing.assert_array_equal(off.mass, default.mass)
    assert "lookahead_tokens" not in off.extras and off.extras["windows"] == 2


def test_lookahead_scores_from_scratch_and_keeps_the_session_table_consistent():
    loaded = loaded_tiny("llama")
    ids = random_ids(80, seed=5)
    plain = make_scorer("llama", loaded, drafter_sessions=2)
    plain(request(ids, session_key="c"))
    stored = plain.sessions.get("c")
    ahead = make_scorer("llama", loaded, drafter_sessions=2, drafter_lookahead_tokens=3)
    ahead.sessions = plain.sessions  # share the table: a look-ahead request must not touch it
    first = ahead(request(ids, session_key="c"))
    again = ahead(request(ids, session_key="c"))
    assert first.scorer_resume == 0 and again.scorer_resume == 0
    assert plain.sessions.get("c") is stored
    np.testing.assert_array_equal(first.mass, again.mass)


def test_lookahead_tap_is_the_prompt_s_scoring_layer_input():
    loaded = loaded_tiny("llama")
    ids = random_ids(70, seed=9)
    result = make_scorer("llama", loaded, drafter_lookahead_tokens=2)(request(ids, want_tap=True))
    x = scoring_layer_inputs(loaded.model, ids, HEAD_LAYER["llama"])
    np.testing.assert_allclose(result.tap, x.numpy(), atol=1e-5)


@pytest.mark.model
def test_smollm2_lookahead_decodes_the_model_s_own_greedy_answer(smollm2_tokenizer):
    from pflash_lab.corpus.needles import needle_prompt

    k = 6
    scorer = DrafterScorer(build_config({"drafter_lookahead_tokens": k}, env={}))
    p = needle_prompt(smollm2_tokenizer, 400, 0.5, needle=0)
    result = scorer(ScoreRequest(ids=p.ids, windows=p.windows, query=p.query))
    with torch.inference_mode():
        out = scorer.model.generate(
            input_ids=torch.tensor([p.ids]), do_sample=False, max_new_tokens=k
        )
    generated = out[0, len(p.ids) :].tolist()  # may stop early at end-of-turn
    tokens = result.extras["lookahead_tokens"]
    assert len(tokens) == k and len(generated) >= 1
    assert tokens[: len(generated)] == generated
