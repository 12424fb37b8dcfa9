"""The shipped tap projection on the embedded drafter: loaded at start and bound to the
drafter file, scored from the same pass as attention, and the fact a paraphrased question
asks for kept by it alone (no sentence embedder)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conftest import PARAPHRASED

from pflash.compress.render.chat import render_chat
from pflash.compress.render.rendered import RenderedPrompt
from pflash.config import build_config
from pflash.errors import ModelUnavailable
from pflash.flow.in_process import compress_in_process
from pflash.models.projection import read_projection_gguf, write_projection_gguf

pytestmark = pytest.mark.model

PROJECTION_ONLY = {
    "mode": "always",
    "keep_ratio": 0.1,
    "select_semantic_weight": 0.0,  # the projection alone: no embedder is loaded
    "select_projection_weight": 1.0,
}


@pytest.fixture(scope="module")
def scorer():
    torch.set_num_threads(1)
    from pflash.models.drafter.scorer import DrafterScorer

    return DrafterScorer(build_config(PROJECTION_ONLY, env={}))


def _messages(fact: str, question: str) -> list[dict]:
    body = open("/usr/share/common-licenses/GPL-3").read()[:6000]
    mid = body.index("\n\n", len(body) // 2)
    content = body[:mid] + "\n\n" + fact + body[mid:] + "\n\n" + question
    return [{"role": "user", "content": content}]


def test_the_shipped_projection_is_bound_to_the_drafter_at_start(scorer):
    projection = scorer.tap_projection()
    assert projection.path.endswith("smollm2_135m_tap_projection_l8.gguf")
    assert projection.weight.shape[1] == scorer.model.config.hidden_size
    assert scorer._embedder is None  # projection evidence reads no second model


@pytest.mark.parametrize(("fact", "question"), PARAPHRASED)
def test_the_projection_alone_keeps_the_fact_a_paraphrased_question_asks_for(
    scorer, smollm2_tokenizer, fact, question
):
    messages = _messages(fact, question)
    ids = tuple(
        smollm2_tokenizer(render_chat(smollm2_tokenizer, messages), add_special_tokens=False)[
            "input_ids"
        ]
    )
    prompt = RenderedPrompt("chat", ids, smollm2_tokenizer, messages=messages)
    asked = []

    def score(req):
        asked.append(req)
        return scorer(req)

    out = compress_in_process(
        prompt,
        build_config(PROJECTION_ONLY, env={}),
        target_tokenizer=smollm2_tokenizer,
        drafter_tokenizer=smollm2_tokenizer,
        scorer=score,
        max_context=8192,
        max_output=64,
    )
    (req,) = asked
    assert len(req.projection_passages) > 40 and req.semantic_texts == ()
    assert out.stats["projection_passages"] == len(req.projection_passages)
    assert out.stats["projection_ms"] > 0 and "semantic_passages" not in out.stats
    assert fact in out.served_text
    assert len(out.served_ids) < 0.2 * len(ids)


def test_a_projection_trained_for_another_drafter_file_is_refused_at_start(scorer, tmp_path):
    from pflash.models.drafter.scorer import DrafterScorer

    shipped = read_projection_gguf(scorer.tap_projection().path)
    other = dataclasses.replace(shipped, runtime_gguf_sha256="0" * 64)
    path = write_projection_gguf(tmp_path / "other.gguf", other)
    config = build_config({**PROJECTION_ONLY, "projection_gguf": str(path)}, env={})
    with pytest.raises(ModelUnavailable, match="different drafter file"):
        DrafterScorer(config, scorer.loaded)  # the loaded model, a new scorer


def test_projection_scores_come_with_the_attention_and_no_tap_unless_asked(scorer):
    from pflash.compress.plan.query import QueryWindow
    from pflash.compress.scoring import ScoreRequest
    from pflash.spans import Span

    ids = tuple(range(100, 400))
    main = QueryWindow(Span(280, 290), 1.0, "main")
    passages = tuple(Span(b, b + 24) for b in range(0, 264, 24))
    req = ScoreRequest(
        ids=ids,
        windows=(main,),
        query=main.span,
        projection_passages=passages,
        projection_question=Span(280, 296),
    )
    result = scorer(req)
    assert result.mass is not None and result.tap is None
    assert result.projection.shape == (len(passages),)
    assert np.all(np.isfinite(result.projection)) and np.all(np.abs(result.projection) <= 1.0)
    tapped = scorer(dataclasses.replace(req, want_tap=True))
    np.testing.assert_allclose(tapped.projection, result.projection, atol=1e-5)
    expected = scorer.tap_projection().similarity(tapped.tap, req.projection_question, passages)
    np.testing.assert_allclose(result.projection, expected, atol=1e-5)


def test_a_later_turn_pools_only_the_passages_its_new_rows_touch(scorer, monkeypatch):
    """The second turn of a conversation reuses the pooled passages of its unchanged prefix
    and gives the projection a from-scratch pass gives (same rows, same vectors)."""
    from pflash.compress.plan.query import QueryWindow
    from pflash.compress.scoring import ScoreRequest
    from pflash.models import projection
    from pflash.spans import Span

    pooled = []
    real = projection.pooled_rows
    monkeypatch.setattr(
        projection,
        "pooled_rows",
        lambda tap, spans, eps: pooled.append(len(spans)) or real(tap, spans, eps),
    )

    def request(n: int, key: str | None) -> ScoreRequest:
        ids = tuple(100 + (i * 7) % 900 for i in range(n))
        main = QueryWindow(Span(n - 12, n - 2), 1.0, "main")
        return ScoreRequest(
            ids=ids,
            windows=(main,),
            query=main.span,
            projection_passages=tuple(Span(b, b + 24) for b in range(0, n - 24, 24)),
            projection_question=Span(n - 12, n),
            session_key=key,
        )

    scorer(request(300, "conversation-a"))
    pooled.clear()
    second = scorer(request(360, "conversation-a"))
    assert second.scorer_resume > 0
    # the question, then only the passages past the reused rows
    new_passages = sum(1 for b in range(0, 336, 24) if b + 24 > second.scorer_resume)
    assert pooled == [1, new_passages] and new_passages < 14
    scratch = scorer(request(360, None))
    np.testing.assert_allclose(second.projection, scratch.projection, atol=1e-5)
