"""Whole-document questions with exact golds (RULER-style aggregation tasks).

Three families, each a pure function of (seed, target tokens, token counter):

- `common_words_list`: a numbered list where 10 words occur `COMMON_TIMES` times each and
  the others `RARE_TIMES` times (10x fewer), in a seeded order; "what are the 10 most
  common words in the above list?" in three phrasings (RULER's common words extraction).
- `frequent_words_text`: pseudo-sentences whose words are drawn Zipf-like (weight 1/rank)
  from a seeded vocabulary; the 3 most frequent words are asked for (RULER's frequent
  words extraction, top 3).
- `word_count_list`: the list of `common_words_list`; "how many times does the word X
  appear in the list?" for one of the common words.

The words are the distinct 6-10 letter words of the corpus the other families use
(`cases.corpus_words`: license texts and standard-library docstrings on this machine).
Golds are computed from the generated text, never assumed: `ranked_counts` counts what a
reader of a text would count.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from pflash_lab.corpus.cases import corpus_words

CountTokens = Callable[[str], int]

TOP_COMMON = 10
COMMON_TIMES = 20
RARE_TIMES = 2
TOP_FREQUENT = 3
VOCABULARY = 400  # words of a frequent-words text

LIST_INTRO = (
    "Below is a numbered list of words. In these words, some appear more often than "
    "others. Memorize the ones that appear most often."
)
TEXT_INTRO = "Read the following text carefully."
COMMON_QUESTIONS = (
    "What are the 10 most common words in the above list?",
    "Which 10 words appear most often in the list above?",
    "List the ten most frequent words in the list.",
)
FREQUENT_QUESTIONS = (
    "What are the 3 most frequently used words in the text above?",
    "Which 3 words appear most often in the text?",
    "Name the three most common words in the passage above.",
)
COUNT_QUESTION = "How many times does the word {word} appear in the list?"

_LIST_LINE = re.compile(r"^\s*\d+\.\s+([a-z]+)\s*$", re.MULTILINE)
_WORD = re.compile(r"[a-z]+")


@dataclass(frozen=True)
class AggregateCase:
    """One prompt: `content` is the user message (document, then question); `gold` the
    asked words (most frequent first) or, for a count, the one word; `gold_count` the
    word's count in the document (counting only); `vocabulary` the words a reader counts."""

    family: str
    seed: int
    content: str
    question: str
    gold: tuple[str, ...]
    vocabulary: frozenset[str]
    gold_count: int = 0


def _list_words(rng: random.Random, tokens: int, count: CountTokens) -> tuple[list[str], list[str]]:
    """(common words, the shuffled list) with about `tokens` target tokens of list lines."""
    pool = list(corpus_words())
    rng.shuffle(pool)
    common, rare = pool[:TOP_COMMON], pool[TOP_COMMON:]
    per_line = count("\n".join(f"{i + 100}. {w}" for i, w in enumerate(pool[:200]))) / 200
    lines = int(tokens / per_line)
    n_rare = max(1, (lines - TOP_COMMON * COMMON_TIMES) // RARE_TIMES)
    items = [w for w in common for _ in range(COMMON_TIMES)]
    items += [w for w in rare[:n_rare] for _ in range(RARE_TIMES)]
    rng.shuffle(items)
    return common, items


def _numbered(items: list[str]) -> str:
    return "\n".join(f"{i}. {w}" for i, w in enumerate(items, start=1))


def common_words_list(seed: int, tokens: int, count: CountTokens) -> AggregateCase:
    rng = random.Random(f"common-words-{seed}-{tokens}")
    common, items = _list_words(rng, tokens, count)
    question = COMMON_QUESTIONS[seed % len(COMMON_QUESTIONS)]
    content = f"{LIST_INTRO}\n\n{_numbered(items)}\n\nQuestion: {question}"
    gold = tuple(w for w, _ in Counter(items).most_common(TOP_COMMON))
    assert set(gold) == set(common)
    return AggregateCase("common_words", seed, content, question, gold, frozenset(items))


def word_count_list(seed: int, tokens: int, count: CountTokens) -> AggregateCase:
    rng = random.Random(f"word-count-{seed}-{tokens}")
    common, items = _list_words(rng, tokens, count)
    word = rng.choice(common)
    question = COUNT_QUESTION.format(word=word)
    content = f"{LIST_INTRO}\n\n{_numbered(items)}\n\nQuestion: {question}"
    return AggregateCase(
        "word_count", seed, content, question, (word,), frozenset(items), items.count(word)
    )


def frequent_words_text(seed: int, tokens: int, count: CountTokens) -> AggregateCase:
    rng = random.Random(f"frequent-words-{seed}-{tokens}")
    pool = list(corpus_words())
    rng.shuffle(pool)
    vocab = pool[:VOCABULARY]
    weights = [1.0 / (rank + 1) for rank in range(VOCABULARY)]
    sentences: list[str] = []
    used = 0
    while used < tokens:
        words = rng.choices(vocab, weights, k=rng.randint(8, 15))
        sentence = " ".join(words).capitalize() + "."
        sentences.append(sentence)
        used += count(sentence) + 1
    paragraphs = [" ".join(sentences[i : i + 5]) for i in range(0, len(sentences), 5)]
    body = "\n\n".join(paragraphs)
    question = FREQUENT_QUESTIONS[seed % len(FREQUENT_QUESTIONS)]
    ranked = ranked_counts(body, frozenset(vocab))
    gold = tuple(w for w, _ in ranked[:TOP_FREQUENT])
    content = f"{TEXT_INTRO}\n\n{body}\n\nQuestion: {question}"
    return AggregateCase("frequent_words", seed, content, question, gold, frozenset(vocab))


FAMILIES: dict[str, Callable[[int, int, CountTokens], AggregateCase]] = {
    "common_words": common_words_list,
    "frequent_words": frequent_words_text,
    "word_count": word_count_list,
}


# ----------------------------------------------------------------------------- metrics


def document_counts(text: str, case: AggregateCase) -> Counter[str]:
    """Occurrences of the case's words in `text` as a reader counts them: list items for
    the list families, every vocabulary word of the text otherwise; the question and the
    instructions are not counted."""
    text = text.replace(case.question, " ")
    if case.family in ("common_words", "word_count"):
        return Counter(w for w in _LIST_LINE.findall(text) if w in case.vocabulary)
    return Counter(w for w in _WORD.findall(text.lower()) if w in case.vocabulary)


def ranked_counts(text: str, vocabulary: frozenset[str]) -> list[tuple[str, int]]:
    """(word, count) of the vocabulary words of `text`, most frequent first, ties by word."""
    counts = Counter(w for w in _WORD.findall(text.lower()) if w in vocabulary)
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def top_recall(counts: Counter[str], gold: tuple[str, ...]) -> float:
    """The share of the gold words a reader of these counts would rank in the top
    len(gold): a gold word counted more than the k-th count is in; a group tied at the
    k-th count shares the slots left (the expected share of a random tie-break); a word
    never seen is out."""
    k = len(gold)
    values = sorted(counts.values(), reverse=True)
    if not values:
        return 0.0
    kth = values[min(k, len(values)) - 1]
    above = sum(1 for v in values if v > kth)
    tied = sum(1 for v in values if v == kth)
    slots = (k - above) / tied if len(values) >= k else 1.0
    credit = 0.0
    for w in gold:
        c = counts.get(w, 0)
        if c > kth:
            credit += 1.0
        elif c == kth and c > 0:
            credit += slots
    return credit / k


def count_error(counts: Counter[str], case: AggregateCase) -> float:
    """|count in the served text - gold count| / gold count (counting family)."""
    got = counts.get(case.gold[0], 0)
    return abs(got - case.gold_count) / case.gold_count
