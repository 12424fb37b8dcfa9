"""The drafter's question-likelihood gain per passage (pflash/models/drafter/likelihood.py).

Tiny random-weight llama, qwen3 and qwen3_5 models: the batched, right-padded computation
must equal one unpadded forward per sequence (the reference below), in every batch split;
the scorer returns it beside unchanged attention mass and fails closed on a bad request.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pflash.compress.query import QueryWindow
from pflash.compress.scoring import ScoreRequest
from pflash.config import build_config
from pflash.errors import CompressionFailed
from pflash.models.drafter import likelihood
from pflash.models.drafter.likelihood import question_likelihood_gain
from pflash.models.drafter.scorer import DrafterScorer
from pflash.models.gguf_io import tiny_decoder
from pflash.models.loading import LoadedModel
from pflash.models.source import ModelSource
from pflash.spans import Span

torch.set_num_threads(1)

ARCH = {"llama": "llama", "qwen3": "qwen3", "qwen3_5": "qwen35"}
HEAD_LAYER = {"llama": 2, "qwen3": 2, "qwen3_5": 7}
LAYERS = {"llama": 4, "qwen3": 4, "qwen3_5": 8}
PASSAGES = (Span(0, 10), Span(10, 27), Span(27, 30), Span(30, 55), Span(55, 58))
QUESTION = Span(60, 70)


def random_ids(n: int, seed: int = 0) -> tuple[int, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(0, 300, (n,), generator=g).tolist())


def reference_gain(model, ids, passages, question) -> np.ndarray:
    """One cache-free forward per sequence, full logits, no batching or padding."""
    q = list(ids[question.begin : question.end])

    def mean_logp(seq):
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([seq])).logits[0].float()
        logp = torch.log_softmax(logits, dim=-1)
        start = len(seq) - len(q)
        return float(
            np.mean([logp[start + t - 1, q[t]].item() for t in range(1, len(q))], dtype=np.float64)
        )

    base = mean_logp(q)
    return np.array([mean_logp(list(ids[p.begin : p.end]) + q) - base for p in passages])


@pytest.fixture(scope="module", params=list(ARCH))
def tiny(request):
    kind = request.param
    model = tiny_decoder(kind, layers=LAYERS[kind])
    model.eval()
    return kind, model


def test_batched_gain_equals_one_forward_per_passage(tiny):
    _, model = tiny
    ids = random_ids(80)
    want = reference_gain(model, ids, PASSAGES, QUESTION)
    with torch.inference_mode():
        got = question_likelihood_gain(model, ids, PASSAGES, QUESTION)
    assert got.dtype == np.float32 and got.shape == (len(PASSAGES),)
    np.testing.assert_allclose(got, want, atol=2e-5)
    assert np.ptp(got) > 1e-3  # passages differ: the comparison is not between constants


@pytest.mark.parametrize("tokens", [12, 30, 64])
def test_every_batch_split_gives_the_same_gains(tiny, monkeypatch, tokens):
    _, model = tiny
    ids = random_ids(80, seed=1)
    with torch.inference_mode():
        whole = question_likelihood_gain(model, ids, PASSAGES, QUESTION)
        monkeypatch.setattr(likelihood, "BATCH_TOKENS", tokens)
        split = question_likelihood_gain(model, ids, PASSAGES, QUESTION)
    np.testing.assert_allclose(split, whole, atol=2e-5)


def test_a_one_token_question_is_refused(tiny):
    _, model = tiny
    with pytest.raises(ValueError, match="likelihood needs 2"):
        question_likelihood_gain(model, random_ids(20), (Span(0, 5),), Span(10, 11))


def _scorer(kind: str, model) -> DrafterScorer:
    loaded = LoadedModel(
        model, ModelSource("tiny", Path(".")), None, 0.0, False, architecture=ARCH[kind]
    )
    settings = {"drafter_head_layer": HEAD_LAYER[kind], "drafter_chunk_tokens": 16}
    return DrafterScorer(build_config(settings, env={}), loaded)


def _request(ids, **kw) -> ScoreRequest:
    main = QueryWindow(Span(70, 72), 1.0, "main")
    return ScoreRequest(ids=ids, windows=(main,), query=main.span, **kw)


def test_the_scorer_returns_gains_beside_unchanged_mass(tiny):
    kind, model = tiny
    ids = random_ids(72, seed=2)
    scorer = _scorer(kind, model)
    plain = scorer(_request(ids))
    both = scorer(_request(ids, likelihood_passages=PASSAGES, likelihood_question=QUESTION))
    assert plain.likelihood is None
    np.testing.assert_array_equal(both.mass, plain.mass)
    np.testing.assert_allclose(
        both.likelihood, reference_gain(model, ids, PASSAGES, QUESTION), atol=2e-5
    )
    assert both.extras["likelihood_passages"] == len(PASSAGES)
    assert both.extras["likelihood_ms"] > 0


@pytest.mark.parametrize(
    ("passages", "question", "message"),
    [
        ((Span(0, 10), Span(60, 80)), QUESTION, "evidence passage out of range"),
        ((Span(0, 10),), None, "likelihood needs a question"),
        ((Span(0, 10),), Span(60, 61), "likelihood needs a question"),
    ],
)
def test_a_bad_likelihood_request_fails_closed_before_any_forward(
    tiny, passages, question, message
):
    kind, model = tiny
    req = _request(random_ids(72), likelihood_passages=passages, likelihood_question=question)
    with pytest.raises(CompressionFailed, match=message) as err:
        _scorer(kind, model)(req)
    assert err.value.stage == "drafter"
