"""Every parser over request text or model output runs in linear time.

Each input here is 100,000 characters or more, shaped to be the worst case of the
backtracking pattern or repeated search it replaced: a quadratic algorithm needs minutes on
them, a linear one milliseconds, so the bound of one second (50 ms for the needle search)
separates the two on any machine. Where a pattern gave way to a scan, a property test
checks the scan against the old pattern on short texts, so the speed did not change what is
found.
"""

from __future__ import annotations

import json
import re
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from pflash.api.tool_calls import ToolCallStream, split_tool_calls
from pflash.compress.entity_feedback import names, opens_sentence
from pflash.compress.lexical import (
    MAX_QUOTES,
    _question_sentences,
    quoted_patterns,
    split_units,
)
from pflash.compress.passage_evidence import HEADER_MAX_CHARS, ends_sentence, passage_texts
from pflash.compress.query import last_occurrence
from pflash.spans import Span, TokenizedText

N = 100_000
NAMES = frozenset({"get_weather"})
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def seconds(fn, *args, **kwargs) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


def word_tokens(text: str) -> TokenizedText:
    """Plain data: one token per run of non-space characters (ids are unused here)."""
    offsets = tuple(m.span() for m in re.finditer(r"\S+", text))
    return TokenizedText(text, tuple(range(len(offsets))), offsets)


# ----------------------------------------------------------------------------- tool calls


def test_an_open_tag_then_whitespace_without_a_close_is_split_in_linear_time():
    text = "<tool_call>" + " " * N + "x"
    assert seconds(split_tool_calls, text, NAMES) < 1.0
    assert split_tool_calls(text, NAMES) == (text, [])


def test_many_open_tags_without_a_close_are_split_in_linear_time():
    text = "<tool_call>\n" * (N // 12)
    assert seconds(split_tool_calls, text, NAMES) < 1.0
    assert split_tool_calls(text, NAMES) == (text, [])


def test_thousands_of_calls_are_all_read_in_linear_time():
    text = (CALL + " ") * (N // len(CALL))
    assert seconds(split_tool_calls, text, NAMES) < 1.0
    content, calls = split_tool_calls(text, NAMES)
    assert content == "" and len(calls) == N // len(CALL)


def test_a_long_streamed_answer_after_an_open_tag_is_held_in_linear_time():
    stream = ToolCallStream(NAMES)
    assert stream.feed("<tool_call>") == ""

    def feed_all():
        for _ in range(N):
            stream.feed("  \n\t   ")

    assert seconds(feed_all) < 1.0
    rest, calls = stream.finish()
    assert calls == [] and rest == "<tool_call>" + "  \n\t   " * N


def _streamed(text: str, cuts: list[int]) -> tuple[str, list]:
    stream = ToolCallStream(NAMES | {"search"})
    bounds = [0, *sorted(c % (len(text) + 1) for c in cuts), len(text)]
    sent = "".join(stream.feed(text[a:b]) for a, b in zip(bounds, bounds[1:], strict=False))
    rest, calls = stream.finish()
    return sent + rest, calls


def _fn(calls) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


PIECES = st.sampled_from(
    [
        CALL,
        '<tool_call>\n{"name": "search", "arguments": "{}"}\n</tool_call>',
        '<tool_call>{"name": "delete_all", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>',
        "<tool_call>",
        "</tool_call>",
        "<tool_",
        "<",
        "_call>",
        " ",
        "\n",
        "The weather is mild. ",
        "Checking.",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(PIECES, max_size=12), st.lists(st.integers(0, 10_000), max_size=20))
def test_streamed_and_whole_answers_give_the_same_calls_and_content(pieces, cuts):
    text = "".join(pieces)
    content, whole = split_tool_calls(text, NAMES | {"search"})
    streamed, calls = _streamed(text, cuts)
    assert _fn(calls) == _fn(whole)
    # streaming sends the text before the first tag as it comes (not stripped)
    assert "".join(streamed.split()) == "".join(content.split())
    if not whole:
        assert streamed == text == content
    assert _streamed(text, [])[0] == streamed  # the chunking changes nothing


# ----------------------------------------------------------------------------- needle search


def test_the_last_occurrence_of_a_needle_is_found_in_linear_time():
    haystack, needle = "a" * 80_000, "ab" + "a" * 40_000
    assert seconds(last_occurrence, haystack, needle) < 0.05
    assert last_occurrence(haystack, needle) == -1
    assert last_occurrence(haystack + needle + "a", needle) == 80_000


@settings(max_examples=500)
@given(
    st.text(alphabet="ab", max_size=12),
    st.text(alphabet="ab", min_size=1, max_size=4),
    st.integers(-3, 15),
    st.one_of(st.none(), st.integers(-3, 15)),
)
def test_last_occurrence_agrees_with_rfind(text, needle, begin, end):
    assert last_occurrence(text, needle, begin, end) == text.rfind(needle, begin, end)


# ----------------------------------------------------------------------------- lexical units

OLD_SENTENCE_END = re.compile(r"[.!?]+[\"')\]]*(?=\s)")


def test_a_line_of_sentence_marks_is_cut_in_linear_time():
    assert seconds(split_units, "." * N + "x") < 1.0
    assert seconds(split_units, "!?" * N + "x", max_chars=None) < 1.0


@settings(max_examples=1000)
@given(st.text(alphabet=".!?\"')] \nab", max_size=30), st.integers(0, 35))
def test_sentence_ends_are_those_the_old_pattern_found(text, end):
    from pflash.compress.lexical import _SENTENCE_END

    old = [m.span() for m in OLD_SENTENCE_END.finditer(text, 0, end)]
    assert [m.span() for m in _SENTENCE_END.finditer(text, 0, end)] == old


def test_a_turn_of_many_questions_is_pooled_in_linear_time():
    text = "Why? " * (N // 5)
    drafter = word_tokens(text)
    inside = split_units(text, max_chars=None)
    took = seconds(_question_sentences, drafter, inside, (0, len(text)), 96)
    assert took < 1.0
    assert _question_sentences(drafter, inside, (0, len(text)), 96)[0] == inside[0]


def test_a_question_quoting_many_strings_is_searched_for_the_first_few():
    text = " ".join(f'"quoted string {i}"' for i in range(40))
    patterns = quoted_patterns(text, [(0, len(text))])
    assert [p.pattern for p in patterns] == [rf"quoted\s+string\s+{i}" for i in range(MAX_QUOTES)]


# ----------------------------------------------------------------------------- passages

OLD_ENDS_SENTENCE = re.compile(r"[.!?][\"')\]]*\s*$|\n\s*$")


def test_a_run_of_newlines_is_read_in_linear_time():
    assert seconds(ends_sentence, "\n" * N + "x") < 1.0
    assert not ends_sentence("\n" * N + "x") and ends_sentence("x." + "\n" * N)


@settings(max_examples=1000)
@given(st.text(alphabet=".!?\"')] \n\t\u00a0ab", max_size=20))
def test_sentence_ends_agree_with_the_old_pattern(piece):
    assert ends_sentence(piece) == bool(OLD_ENDS_SENTENCE.search(piece))


def test_passages_under_one_long_code_header_are_read_in_linear_time():
    header = "def f(" + "x" * 1_000_000 + "):"
    text = header + "\n" + "    y = 1\n" * 20_000
    drafter = TokenizedText(
        text,
        tuple(range(20_001)),
        (
            (0, len(header)),
            *((len(header) + 1 + 10 * i, len(header) + 11 + 10 * i) for i in range(20_000)),
        ),
    )
    passages = tuple(Span(i, i + 1) for i in range(20_001))
    assert seconds(passage_texts, drafter, passages) < 1.0
    texts = passage_texts(drafter, passages)
    assert texts[0] == header and set(texts[1:]) == {header[:HEADER_MAX_CHARS] + "\n    y = 1\n"}


# ----------------------------------------------------------------------------- entity names

OLD_SENTENCE_START = re.compile(r"(?:^|[.!?:;\n]|[.!?][\"')\]])[\s\"'(\[*#>-]*$")


def test_names_in_a_long_passage_are_read_in_linear_time():
    text = " ".join(f"Ab{i}." for i in range(N // 8))
    assert seconds(names, [text]) < 1.0


@settings(max_examples=2000)
@given(st.text(alphabet=".!?:;\"')]([*#>- \n\t\u00a0aZ", max_size=16))
def test_sentence_openings_agree_with_the_old_pattern(prefix):
    text = prefix + "Name"
    at = len(prefix)
    assert opens_sentence(text, at) == bool(OLD_SENTENCE_START.search(text, 0, at))
