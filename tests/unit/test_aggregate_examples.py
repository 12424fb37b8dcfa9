"""Whole-document questions in prompts formatted as benchmarks and users write them
(pflash/compress/evidence/aggregate.py, stratified.py): a closing answer prefix after the
question, a worked example of the same task before the real material, a numbered list
flattened to one line.

The scorer is a test double of the drafter that puts all attention on the prompt's first
tokens (the worked example), so what is asserted is the pipeline's own sample.
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np

from pflash.compress.evidence.stratified import document_units
from pflash.compress.pipeline import CompressionRequest, prepare
from pflash.compress.render.chat import render_chat
from pflash.compress.render.rendered import RenderedPrompt
from pflash.compress.scoring import ScoreResult
from pflash.config import build_config
from pflash.flow.in_process import compress_in_process

WORDS = [f"word{chr(97 + i)}{chr(97 + j)}" for i in range(26) for j in range(26)]
REAL_COMMON, EXAMPLE_COMMON = WORDS[:10], WORDS[10:20]
INTRO = "Below is a numbered list of words. Memorize the ones that appear most often."
QUESTION = "Question: What are the 10 most common words in the above list?"
PREFIX = "Answer: The top 10 words that appear most often in the list are:"


def _inline(items: list[str]) -> str:
    """A numbered list on one line, as benchmarks that flatten their lists write it."""
    return " ".join(f"{i}. {w}" for i, w in enumerate(items, start=1))


def _spread(items: list[str], stride: int) -> list[str]:
    return [items[(i * stride) % len(items)] for i in range(len(items))]


def _real_list() -> list[str]:
    """10 common words x 30, 200 others x 3, interleaved by a fixed stride (no RNG)."""
    items = [w for w in REAL_COMMON for _ in range(30)] + [
        w for w in WORDS[20:220] for _ in range(3)
    ]
    return _spread(items, 389)


def _example_list() -> list[str]:
    """The worked example: its own 10 common words x 10, 30 others x 3."""
    items = [w for w in EXAMPLE_COMMON for _ in range(10)]
    items += [w for w in WORDS[300:330] for _ in range(3)]
    return _spread(items, 97)


def _few_shot_content() -> str:
    example_answer = " ".join(f"{i}. {w}" for i, w in enumerate(EXAMPLE_COMMON, start=1))
    example = f"{INTRO}\n{_inline(_example_list())}\n{QUESTION} {PREFIX} {example_answer}"
    return f"{example}\n{INTRO}\n{_inline(_real_list())}\n{QUESTION} {PREFIX}"


def _rendered(tokenizer, content: str) -> RenderedPrompt:
    messages = [{"role": "user", "content": content}]
    ids = tuple(tokenizer(render_chat(tokenizer, messages), add_special_tokens=False)["input_ids"])
    return RenderedPrompt("chat", ids, tokenizer, messages=messages)


def _first_tokens_scorer(req):
    """All attention on the prompt's first 600 tokens (the worked example), tiny elsewhere."""
    mass = np.full(len(req.ids), 1e-6, dtype=np.float32)
    mass[:600] = 1.0
    mass[req.query.begin : req.query.end] = 0.0
    return ScoreResult(mass=mass / mass.sum(), scorer_new_tokens=len(req.ids))


CFG = dict(keep_ratio=0.1, select_chunk_size=64, select_semantic_weight=0.0)


def _prepared_kind(tokenizer, content: str) -> str | None:
    config = build_config({**CFG, "mode": "auto", "threshold": 512}, env={})
    inp = CompressionRequest(_rendered(tokenizer, content), max_output=64, max_context=32_768)
    prepared = prepare(inp, config=config, target_tokenizer=tokenizer, drafter_tokenizer=tokenizer)
    return prepared.question.kind if prepared.question is not None else None


def test_a_closing_answer_prefix_does_not_hide_the_question(smollm2_tokenizer):
    """A completion-style prompt ends with the start of its answer after the question; the
    question before it is still the one that decides the kind (before: none was found, and
    the list was served by score)."""
    body = "\n".join(f"{i}. {w}" for i, w in enumerate(_real_list(), start=1))
    content = f"{INTRO}\n{body}\n{QUESTION} {PREFIX}"
    assert _prepared_kind(smollm2_tokenizer, content) == "frequency"
    coded = " ".join(_real_list())
    fwe = (
        f"Read the following coded text. {coded}\nQuestion: What are the three most "
        "frequently appeared words in the above coded text? Answer: According to the coded "
        "text above, the three most frequently appeared words are:"
    )
    assert _prepared_kind(smollm2_tokenizer, fwe) == "frequency"


def test_an_answer_prefix_that_asks_is_still_the_question(smollm2_tokenizer):
    content = f"{INTRO}\n{_inline(_real_list())}\nAnswer this: which 10 words appear most often?"
    assert _prepared_kind(smollm2_tokenizer, content) == "frequency"


def test_a_numbered_list_on_one_line_is_cut_at_its_items():
    text = f"{INTRO}\n{_inline(['goose', 'lifetime', 'evening-wear', 'goose'] * 30)}\nQuestion: x"
    units = [text[b:e] for b, e in document_units(text)]
    assert units[0] == INTRO and units[-1] == "Question: x"
    items = units[1:-1]
    assert items[:4] == ["1. goose", "2. lifetime", "3. evening-wear", "4. goose"]
    assert len(items) == 120 and all(u.split(". ")[0].isdigit() for u in items)


def test_a_worked_example_before_the_list_is_not_sampled_as_the_list(smollm2_tokenizer):
    """Few-shot: the task once worked (its own list, question and answer), then the real
    list. The sample is spent on the real list's frequent entries, in proportion, and the
    example's list is left to the end (before: 38 of 48 served entries were the example's,
    RULER's common words at 8K, and the real list's ten could not be ranked)."""
    config = build_config({**CFG, "mode": "always"}, env={})
    content = _few_shot_content()
    out = compress_in_process(
        _rendered(smollm2_tokenizer, content),
        config,
        target_tokenizer=smollm2_tokenizer,
        drafter_tokenizer=smollm2_tokenizer,
        scorer=_first_tokens_scorer,
        max_context=32_768,
        max_output=64,
    )
    assert out.compressed and out.stats["question_kind"] == "frequency"
    assert len(out.served_ids) < 0.2 * len(out.plan.drafter.ids)
    served = set(re.findall(r"(?<!\d)(\d+)\. (word[a-z]{2})", out.served_text))
    real = Counter(w for i, w in enumerate(_real_list(), start=1) if (str(i), w) in served)
    example = [w for i, w in enumerate(_example_list(), start=1) if (str(i), w) in served]
    assert not example
    assert set(real) == set(REAL_COMMON)  # only the frequent words' entries
    assert min(real.values()) >= 0.5 * max(real.values())  # each in proportion
