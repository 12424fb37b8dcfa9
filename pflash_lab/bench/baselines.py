"""Baselines that compress the same document to the same budget, for the same table.

- `tail_truncate`: keep the last `budget` tokens of the document (what a context-window
  overflow does by default);
- `random_chunks`: seeded random 64-token chunks up to the budget, in source order (the
  floor any scorer must beat);
- `LongLLMLingua`: Microsoft's `llmlingua` package in LongLLMLingua question-aware mode
  (coarse document ranking by the question's conditional perplexity, then iterative
  token-level pruning), run on the same small LM as PFlash's drafter.

Each returns the compressed *document* only; the question and instructions are added
around it unchanged, so every method answers the same question. Budgets are target tokens
of the document: `floor(ratio * document_tokens)`.

LLMLingua offline. The package works here with three adaptations, none of which touches
its algorithm: (1) the model is the embedded SmolLM2, loaded from the HF directory that
`pflash.models.loading.load_causal_lm` converted and cached (plus its tokenizer), never a
hub download; (2) `tiktoken.encoding_for_model("gpt-3.5-turbo")`, which downloads the
cl100k BPE file on first use, is replaced by a counter over the SmolLM2 tokenizer, so its
`rate` is measured in the same tokens as PFlash's keep ratio; (3) llmlingua 0.2.2 passes
the legacy tuple KV cache (`past_key_values[0][0]`, lists of [k, v]) that transformers 5
no longer accepts, so the model is wrapped to convert to and from `DynamicCache`.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

CHUNK_TOKENS = 64


@dataclass(frozen=True)
class BaselineOutput:
    """A compressed document with the wall time it took (milliseconds)."""

    document: str
    kept_tokens: int
    compress_ms: float


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def budget_tokens(n_tokens: int, ratio: float) -> int:
    """The kept-token budget at `ratio` (floor, at least one token)."""
    return max(1, math.floor(n_tokens * ratio))


def tail_truncate(document: str, ratio: float, tokenizer) -> BaselineOutput:
    """The document's last `budget` tokens."""
    t0 = time.perf_counter()
    ids = _ids(tokenizer, document)
    keep = ids[len(ids) - budget_tokens(len(ids), ratio) :]
    text = _decode(tokenizer, keep)
    return BaselineOutput(text, len(keep), (time.perf_counter() - t0) * 1000)


def random_chunks(
    document: str, ratio: float, tokenizer, seed: int, chunk: int = CHUNK_TOKENS
) -> BaselineOutput:
    """Seeded random chunks of `chunk` tokens up to the budget, joined in source order."""
    t0 = time.perf_counter()
    ids = _ids(tokenizer, document)
    budget = budget_tokens(len(ids), ratio)
    starts = list(range(0, len(ids), chunk))
    random.Random(seed).shuffle(starts)
    chosen, used = [], 0
    for s in starts:
        n = min(chunk, len(ids) - s)
        if used + n > budget:
            continue
        chosen.append(s)
        used += n
    pieces = [_decode(tokenizer, ids[s : s + chunk]) for s in sorted(chosen)]
    return BaselineOutput("\n\n".join(pieces), used, (time.perf_counter() - t0) * 1000)


def uniform_chunks(
    document: str, budget: int, tokenizer, chunk: int = CHUNK_TOKENS
) -> BaselineOutput:
    """Chunks of `chunk` tokens evenly spaced over the document, `budget` tokens in all
    (the last chunk cut to fit), joined in source order: what a scorer must beat at the same
    realized keep, and what preserves a whole-document question's frequencies."""
    t0 = time.perf_counter()
    ids = _ids(tokenizer, document)
    budget = max(1, min(budget, len(ids)))
    starts = list(range(0, len(ids), chunk))
    take = min(len(starts), -(-budget // chunk))  # chunks needed, at most all of them
    picked = [starts[(i * len(starts)) // take] for i in range(take)]
    pieces, used = [], 0
    for s in picked:
        n = min(chunk, len(ids) - s, budget - used)
        if n <= 0:
            break
        pieces.append(_decode(tokenizer, ids[s : s + n]))
        used += n
    return BaselineOutput("\n\n".join(pieces), used, (time.perf_counter() - t0) * 1000)


# --------------------------------------------------------------------------- LongLLMLingua


class _TokenCounter:
    """tiktoken's `Encoding` surface that llmlingua uses (encode/decode), on an HF tokenizer."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode(self, text: str, **_: object) -> list[int]:
        return _ids(self.tokenizer, text)

    def decode(self, ids: list[int]) -> str:
        return _decode(self.tokenizer, list(ids))


class _LegacyCacheModel:
    """A causal LM that takes and returns llmlingua's legacy list-of-[k, v] KV cache."""

    def __init__(self, model):
        self.model = model
        self.config = model.config
        self.device = model.device

    def __call__(self, input_ids=None, attention_mask=None, past_key_values=None, **kw):
        from transformers import DynamicCache

        if past_key_values is not None and not isinstance(past_key_values, DynamicCache):
            past_key_values = DynamicCache(
                ddp_cache_data=[(k, v) for k, v in past_key_values], config=self.config
            )
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
            **kw,
        )
        cache = getattr(out, "past_key_values", None)
        if cache is not None and not isinstance(cache, list):
            out.past_key_values = [[layer.keys, layer.values] for layer in cache.layers]
        return out


def llmlingua_model_dir(spec: str) -> Path:
    """An HF directory llmlingua can load: the converted weights plus the tokenizer."""
    from pflash.models.loading import load_causal_lm
    from pflash.models.source import cache_dir, load_tokenizer

    loaded = load_causal_lm(spec)
    if loaded.sha256 is None:  # already an HF directory
        return loaded.source.directory
    converted = cache_dir() / "models" / loaded.sha256  # where load_causal_lm saved it
    out = cache_dir() / "llmlingua" / loaded.sha256
    if not (out / "tokenizer_config.json").is_file():
        out.mkdir(parents=True, exist_ok=True)
        for f in converted.iterdir():
            link = out / f.name
            if not link.exists():
                link.symlink_to(f)
        load_tokenizer(spec).save_pretrained(str(out))
    return out


class LongLLMLingua:
    """LongLLMLingua (question-aware) with the embedded drafter model, offline.

    Settings follow the LongLLMLingua recipe in the package's README: rank documents by
    `longllmlingua` with the question after the condition, sort by rank, dynamic context
    ratio 0.3, contrastive (condition_compare) token pruning, `context_budget "+100"`.
    The document is split into `doc_tokens`-token pieces at paragraph breaks (its
    "documents").
    """

    def __init__(self, spec: str, tokenizer, *, doc_tokens: int = 256):
        import llmlingua.prompt_compressor as pc

        self.tokenizer = tokenizer
        self.doc_tokens = doc_tokens
        directory = llmlingua_model_dir(spec)
        real = pc.tiktoken
        pc.tiktoken = SimpleNamespace(encoding_for_model=lambda _name: _TokenCounter(tokenizer))
        try:
            self.compressor = pc.PromptCompressor(
                model_name=str(directory),
                device_map="cpu",
                model_config={"local_files_only": True, "trust_remote_code": False},
            )
        finally:
            pc.tiktoken = real
        self.compressor.model = _LegacyCacheModel(self.compressor.model)

    def split(self, document: str) -> list[str]:
        """Paragraph groups of about `doc_tokens` tokens (LongLLMLingua ranks these)."""
        docs, current, n = [], [], 0
        for p in document.split("\n\n"):
            k = len(_ids(self.tokenizer, p))
            if current and n + k > self.doc_tokens:
                docs.append("\n\n".join(current))
                current, n = [], 0
            current.append(p)
            n += k
        if current:
            docs.append("\n\n".join(current))
        return docs

    def __call__(self, document: str, question: str, ratio: float) -> BaselineOutput:
        t0 = time.perf_counter()
        result = self.compressor.compress_prompt(
            self.split(document),
            question=question,
            rate=ratio,
            condition_in_question="after_condition",
            reorder_context="sort",
            dynamic_context_compression_ratio=0.3,
            condition_compare=True,
            context_budget="+100",
            rank_method="longllmlingua",
            concate_question=False,
        )
        text = result["compressed_prompt"]
        ms = (time.perf_counter() - t0) * 1000
        return BaselineOutput(text, len(_ids(self.tokenizer, text)), ms)
