"""Questions about the whole document: the detector (pflash/compress/evidence/aggregate.py),
and the uniform sample strict selection keeps for them (stratified.py; the gate:
test_budget.py).

The scorer in the pipeline tests is a test double of the drafter (a pure function of the
prompt): it puts all attention on the first lines of a list, as a drafter's recency and
sink bias does, so what is asserted is the pipeline's own choice between that ranking and
the uniform sample.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pydantic
import pytest

from pflash.compress.evidence.aggregate import asks_most_frequent, classify_question
from pflash.compress.evidence.stratified import bit_reversal_rank, frequent_units
from pflash.compress.pipeline import CompressionRequest, prepare, uncompressed
from pflash.compress.render.chat import render_chat
from pflash.compress.render.rendered import RenderedPrompt
from pflash.compress.scoring import ScoreResult
from pflash.config import build_config
from pflash.flow.in_process import compress_in_process
from pflash.serving.usage import PFlashStats

# (question, kind or None): several phrasings per kind, and the fact lookups that share
# their words ("how many", "most common", "list all", "summary") but ask one fact
TABLE = [
    # frequency
    ("What are the 10 most common words in the above list?", "frequency"),
    ("Which 10 words appear most often in the list above?", "frequency"),
    ("List the ten most frequent words in the list.", "frequency"),
    ("What are the 3 most frequently used words in the text above?", "frequency"),
    ("Which word is mentioned most often?", "frequency"),
    ("Give the top 10 words by frequency.", "frequency"),
    ("Name the three most common words in the passage above.", "frequency"),
    ("Which city is the most frequently mentioned one?", "frequency"),
    ("Which 3 keywords appear most often in the keyword log entries? Name them.", "frequency"),
    # count
    ("How many times does the word apple appear in the list?", "count"),
    ("How often is Paris mentioned in the text?", "count"),
    ("How many times is 'blue' repeated?", "count"),
    ("Count the number of times the word river occurs.", "count"),
    ("How many words are in the list?", "count"),
    ("How many distinct words does the list contain?", "count"),
    ("How many people are mentioned in the text?", "count"),
    ("What is the number of occurrences of the word cat?", "count"),
    # enumerate
    ("List all the cities mentioned in the text.", "enumerate"),
    ("Name every character that appears in the story.", "enumerate"),
    ("What are all the dates in the document?", "enumerate"),
    ("Extract each email address listed above.", "enumerate"),
    ("List all 10 words in the list above.", "enumerate"),
    # summary
    ("Summarize the document.", "summary"),
    ("Give me a brief summary of the whole text.", "summary"),
    ("What is the overall summary?", "summary"),
    ("Summarize this.", "summary"),
    ("What are the main points of the article?", "summary"),
    ("What is this text about?", "summary"),
    # fact lookups: not aggregate
    ("How many employees does Acme have?", None),
    ("How many employees are there at Acme?", None),
    ("How many times did the team win the championship?", None),
    ("How often does the ferry leave?", None),
    ("How many people died in the accident described in the text?", None),
    ("What is the number of employees at Acme?", None),
    ("What is the most common side effect?", None),
    ("What is the frequency of the bus?", None),
    ("List all their names.", None),
    (
        "Which variables are assigned the value 12345, directly or through other variables? "
        "List all their names.",
        None,
    ),
    ("What are all the special magic numbers for X? List every one of them.", None),
    # RULER's variable tracking: the value is the key the chain starts from
    ("Find all variables that are assigned the value 62950 in the text above.", None),
    ("Find all rows whose code is ab12 in the table.", None),
    (
        "What are all the special magic numbers for fair-sundial mentioned in the provided text?",
        None,
    ),
    ("Summarize the paragraph about taxes.", None),
    ("What is the special magic quokka number?", None),
    ("What does this licence say about trademarks?", None),
    ("Which floor is room 12 on?", None),
    ("What is the capital of France?", None),
]


@pytest.mark.parametrize(("question", "kind"), TABLE)
def test_detector_names_whole_document_questions_and_leaves_fact_lookups(question, kind):
    got = classify_question(question)
    assert (got.kind if got else None) == kind


def test_detector_table_holds_both_sides():
    kinds = Counter(k for _, k in TABLE)
    assert len(TABLE) >= 30 and kinds[None] >= 12
    assert all(kinds[k] >= 4 for k in ("frequency", "count", "enumerate", "summary"))


def test_detector_is_linear_on_a_long_unpunctuated_question():
    text = "how many " + "of the words " * 20000 + "in the list"
    assert classify_question(text) is None  # read up to its cap, and fast


def test_bit_reversal_prefixes_are_evenly_spread():
    rank = bit_reversal_rank(16)
    order = np.argsort(rank)
    assert sorted(rank.tolist()) == list(range(16))
    assert order[:4].tolist() == [0, 8, 4, 12]  # every 4th index
    assert sorted(order[:8].tolist()) == list(range(0, 16, 2))
    odd = bit_reversal_rank(11)
    assert sorted(odd.tolist()) == list(range(11))
    assert sorted(np.argsort(odd)[:3].tolist()) == [0, 4, 8]


# ----------------------------------------------------------------------------- the pipeline

WORDS = [f"word{chr(97 + i)}{chr(97 + j)}" for i in range(26) for j in range(26)]
COMMON = WORDS[:10]
QUESTION = "What are the 10 most common words in the above list?"


def _word_list() -> list[str]:
    """10 common words x 20, 300 others x 2, interleaved by a fixed stride (no RNG)."""
    items = [w for w in COMMON for _ in range(20)] + [w for w in WORDS[10:310] for _ in range(2)]
    return [items[(i * 389) % len(items)] for i in range(len(items))]


def _list_chat(tokenizer, question: str = QUESTION):
    body = "\n".join(f"{i}. {w}" for i, w in enumerate(_word_list(), start=1))
    messages = [{"role": "user", "content": f"Here is a list of words.\n\n{body}\n\n{question}"}]
    ids = tuple(tokenizer(render_chat(tokenizer, messages), add_special_tokens=False)["input_ids"])
    return messages, ids


def _head_scorer(req):
    """All attention on the list's first 60 lines (tokens 0..400), tiny elsewhere."""
    mass = np.full(len(req.ids), 1e-6, dtype=np.float32)
    mass[:400] = 1.0
    mass[req.query.begin : req.query.end] = 0.0
    return ScoreResult(mass=mass / mass.sum(), scorer_new_tokens=len(req.ids))


def _serve(tokenizer, config, messages, ids):
    prompt = RenderedPrompt("chat", ids, tokenizer, messages=messages)
    return compress_in_process(
        prompt,
        config,
        target_tokenizer=tokenizer,
        drafter_tokenizer=tokenizer,
        scorer=_head_scorer,
        max_context=32_768,
        max_output=64,
    )


def _top_recall(served: str) -> float:
    counts = Counter(
        line.split(". ", 1)[1]
        for line in served.splitlines()
        if ". word" in line and line.split(". ", 1)[0].isdigit()
    )
    top = {w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:10]}
    return len(top & set(COMMON)) / 10


CFG = dict(keep_ratio=0.1, select_chunk_size=64, select_semantic_weight=0.0)


def _served_lines(out) -> list[tuple[int, str]]:
    return [
        (int(line.split(".")[0]), line.split(". ", 1)[1])
        for line in out.served_text.splitlines()
        if ". word" in line
    ]


def test_always_samples_the_lines_of_frequent_words_evenly_and_keeps_the_top_words(
    smollm2_tokenizer,
):
    """The 80-line budget is spent on the 200 lines of the 10 common words, evenly over the
    list: each keeps ~8 occurrences instead of ~2 in a sample of every line, and no word
    that appears twice is kept to look as frequent (before: recall 0.9 on this list)."""
    config = build_config({**CFG, "mode": "always"}, env={})
    messages, ids = _list_chat(smollm2_tokenizer)
    out = _serve(smollm2_tokenizer, config, messages, ids)
    assert out.compressed and out.stats["question_kind"] == "frequency"
    assert len(out.served_ids) < 0.2 * len(ids)
    assert out.served_text.rstrip().endswith("<|im_start|>assistant")
    assert QUESTION in out.served_text
    lines = _served_lines(out)
    numbers = [n for n, _ in lines]
    n_lines = len(_word_list())
    assert len(numbers) >= 0.08 * n_lines
    assert {w for _, w in lines} == set(COMMON)  # only the frequent words' lines
    assert min(Counter(w for _, w in lines).values()) >= 4  # each in proportion
    assert max(numbers) > 0.9 * n_lines and min(numbers) < 0.1 * n_lines  # the whole list
    frequent = [i for i, w in enumerate(_word_list(), start=1) if w in COMMON]
    gaps = np.diff(sorted(frequent.index(n) for n in numbers))
    assert gaps.max() <= 3 * np.median(gaps)  # evenly over the frequent lines, not a block
    assert _top_recall(out.served_text) == 1.0


def test_a_question_for_the_least_frequent_words_samples_every_line(smollm2_tokenizer):
    config = build_config({**CFG, "mode": "always"}, env={})
    question = "Which words appear least often in the above list?"
    messages, ids = _list_chat(smollm2_tokenizer, question)
    out = _serve(smollm2_tokenizer, config, messages, ids)
    assert out.stats["question_kind"] == "frequency"
    words = [w for _, w in _served_lines(out)]
    rare = [w for w in words if w not in COMMON]
    assert len(rare) >= 0.5 * len(words)  # the rare lines are sampled like the others


def test_frequent_units_are_those_holding_a_word_many_units_hold():
    lines = [f"{i}. {'apple' if i % 4 == 0 else f'rare{i // 2}'}" for i in range(400)]
    frequent = frequent_units(lines)
    assert frequent.tolist() == [i % 4 == 0 for i in range(400)]
    # the frame every log line shares is no item: the repeated keywords are what is frequent
    log = [f"Keyword log entry: {'alpha' if i % 5 == 0 else f'rare{i}'}." for i in range(50)]
    assert frequent_units(log).tolist() == [i % 5 == 0 for i in range(50)]
    assert frequent_units([]).size == 0 and not frequent_units(["", "  "]).any()


@pytest.mark.parametrize(
    ("sentence", "most"),
    [
        ("What are the 10 most common words in the above list?", True),
        ("Which word appears least often in the list?", False),
        ("Name the rarest words of the text by frequency.", False),
    ],
)
def test_only_a_question_for_the_most_frequent_items_samples_them_first(sentence, most):
    question = classify_question(sentence)
    assert question is not None and question.kind == "frequency"
    assert asks_most_frequent(question) is most


def test_a_fact_question_on_the_same_list_keeps_the_score_ranking(smollm2_tokenizer):
    config = build_config({**CFG, "mode": "always"}, env={})
    messages, ids = _list_chat(smollm2_tokenizer, "What is the word on line 5?")
    out = _serve(smollm2_tokenizer, config, messages, ids)
    assert out.stats["question_kind"] is None
    numbers = [int(line.split(".")[0]) for line in out.served_text.splitlines() if ". word" in line]
    # where the attention was (the lines before the question share its mandatory chunk)
    assert np.mean(np.asarray(numbers) < 0.1 * len(_word_list())) >= 0.8


def test_auto_serves_an_aggregate_question_whole_and_says_why(smollm2_tokenizer):
    config = build_config({**CFG, "mode": "auto", "threshold": 512}, env={})
    messages, ids = _list_chat(smollm2_tokenizer)
    inp = CompressionRequest(
        RenderedPrompt("chat", tuple(ids), smollm2_tokenizer, messages=messages),
        max_output=64,
        max_context=32_768,
    )
    prepared = prepare(
        inp, config=config, target_tokenizer=smollm2_tokenizer, drafter_tokenizer=smollm2_tokenizer
    )
    assert not prepared.compress and prepared.reason == "aggregate_question"
    out = uncompressed(prepared)
    assert out.served_ids == ids
    assert out.stats["stop_reason"] == "aggregate_question"
    assert PFlashStats(**out.stats).question_kind == "frequency"


def test_a_question_asked_before_the_document_is_read(smollm2_tokenizer):
    config = build_config({**CFG, "mode": "auto", "threshold": 512}, env={})
    body = "\n".join(f"{i}. {w}" for i, w in enumerate(_word_list(), start=1))
    messages = [{"role": "user", "content": f"How many times does worda appear below?\n\n{body}"}]
    ids = tuple(
        smollm2_tokenizer(render_chat(smollm2_tokenizer, messages), add_special_tokens=False)[
            "input_ids"
        ]
    )
    inp = CompressionRequest(
        RenderedPrompt("chat", tuple(ids), smollm2_tokenizer, messages=messages),
        max_output=64,
        max_context=32_768,
    )
    prepared = prepare(
        inp, config=config, target_tokenizer=smollm2_tokenizer, drafter_tokenizer=smollm2_tokenizer
    )
    assert prepared.question is not None and prepared.question.kind == "count"


def test_stats_field_takes_only_the_four_kinds():
    assert PFlashStats(question_kind="summary").question_kind == "summary"
    assert PFlashStats().question_kind is None
    with pytest.raises(pydantic.ValidationError):
        PFlashStats(question_kind="lookup")


def test_an_imperative_question_after_a_label_is_read(smollm2_tokenizer):
    """ "Question: List the ten most frequent words in the list." asks without a "?" and
    opens with a label: the label is read past (the bench's third phrasing was missed)."""
    config = build_config({**CFG, "mode": "auto", "threshold": 512}, env={})
    messages, ids = _list_chat(
        smollm2_tokenizer, "Question: List the ten most frequent words in the list."
    )
    inp = CompressionRequest(
        RenderedPrompt("chat", tuple(ids), smollm2_tokenizer, messages=messages),
        max_output=64,
        max_context=32_768,
    )
    prepared = prepare(
        inp, config=config, target_tokenizer=smollm2_tokenizer, drafter_tokenizer=smollm2_tokenizer
    )
    assert prepared.question is not None and prepared.question.kind == "frequency"
