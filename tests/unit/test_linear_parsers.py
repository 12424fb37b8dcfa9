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

from pflash.compress.evidence.anchors import MAX_QUOTES, quoted_patterns
from pflash.compress.evidence.code_blocks import BLOCK_MAX_CHARS, block_texts, passage_blocks
from pflash.compress.evidence.entity_feedback import names
from pflash.compress.evidence.lexical import _question_sentences
from pflash.compress.evidence.passage_evidence import HEADER_MAX_CHARS, passage_texts
from pflash.compress.evidence.words import split_units
from pflash.compress.plan.query import last_occurrence
from pflash.compress.render import passages as passages_module
from pflash.compress.render.passages import passages as system_passages
from pflash.compress.text.code_headers import code_lines
from pflash.compress.text.sentences import ends_sentence, opens_sentence, sentence_ends
from pflash.models.target.decoding import StopScanner
from pflash.serving.tool_calls import ToolCallStream, split_tool_calls
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
    old = [m.end() for m in OLD_SENTENCE_END.finditer(text, 0, end)]
    assert sentence_ends(text, 0, end) == old


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


def test_code_blocks_under_one_long_header_are_read_in_linear_time():
    header = "def f(" + "x" * 1_000_000 + "):"
    text = header + "\n" + "    y = 1\n" * 20_000
    offsets = (
        (0, len(header)),
        *((len(header) + 1 + 10 * i, len(header) + 11 + 10 * i) for i in range(20_000)),
    )
    drafter = TokenizedText(text, tuple(range(20_001)), offsets)
    passages = tuple(Span(i, i + 1) for i in range(20_001))
    assert seconds(passage_blocks, drafter, passages) < 1.0
    (block,) = passage_blocks(drafter, passages)
    assert len(block.passages) == 20_001
    assert [len(t) for t in block_texts(drafter, [block])] == [BLOCK_MAX_CHARS]


def test_signatures_left_open_are_read_in_linear_time():
    one = "def f(" + "(" * 200 + "\n" + "    x,\n" * 40
    text = one * 2_500  # every signature open for its whole bound of lines
    assert seconds(code_lines, text, 0, len(text)) < 1.0


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


# ----------------------------------------------------------------------------- system documents
# The detection as it was before it became linear: the reference for the property tests.

OLD_HEADING = re.compile(
    passages_module._HEADING.pattern.replace(r"(?:\s*:\s*$|\s*$)", r"\s*:?\s*$"),
    re.IGNORECASE | re.MULTILINE,
)


def old_tagged(text: str) -> list[tuple[int, int]]:
    out = []
    for m in passages_module._TAG.finditer(text):
        close = text.find(f"</{m.group(1)}>", m.end())
        if close > m.end():
            out.append((m.end(), close))
    return out


def old_sections(text: str) -> list[tuple[int, int]]:
    out = []
    for m in OLD_HEADING.finditer(text):
        begin = m.end()
        end = len(text)
        for h in passages_module._HEADING_LINE.finditer(text, begin):
            if h.start() > begin and text[max(0, h.start() - 2) : h.start()] == "\n\n":
                if not OLD_HEADING.match(text, h.start()):
                    end = h.start()
                    break
        if end == len(text):
            last = text.rfind("\n\n", begin)
            if last > begin and len(text[last:].strip()) <= 300:
                end = last
        out.append((begin, end))
    return out


def old_passages(content: str, min_chars: int, max_pieces: int = 8) -> list[tuple[int, int]]:
    found = [
        *old_tagged(content),
        *passages_module._fenced(content),
        *old_sections(content),
        *passages_module._long_paragraphs(content, 2 * min_chars),
    ]
    kept = passages_module._merge(
        [(b, e) for b, e in found if len(content[b:e].strip()) >= min_chars]
    )
    while kept and len(passages_module._complement(kept, len(content))) > max_pieces:
        kept.remove(min(kept, key=lambda r: r[1] - r[0]))
    return kept


def test_many_unclosed_tags_are_read_in_linear_time():
    text = "<a>" * (N // 3)
    assert seconds(system_passages, text, 200) < 1.0
    assert system_passages(text, 200) == [(0, len(text))]  # one long paragraph: a document
    closed = "<a>\n\n" * (N // 5) + "x" * 300 + "</a>"  # every opening tag reaches the close
    assert seconds(system_passages, closed, 200) < 1.0
    assert system_passages(closed, 200) == [(3, len(closed) - 4)]


def test_many_document_headings_are_read_in_linear_time():
    text = "context:\n" * (N // 9)
    assert seconds(system_passages, text, 200) < 1.0
    assert system_passages(text, 200) == [(0, len(text))]  # one paragraph: a document
    spaced = "Context:\n\nA:\n" * (N // 13)  # a heading line after every blank line
    assert seconds(system_passages, spaced, 200) < 1.0


def test_a_heading_word_then_a_long_run_of_spaces_is_read_in_linear_time():
    text = "context" + " " * N + "x"
    assert seconds(system_passages, text, 200) < 1.0
    assert list(passages_module._HEADING.finditer(text)) == []


def test_many_short_documents_are_reduced_to_eight_pieces_in_linear_time():
    text = "".join(f"Note {i}.\n<d>{'y' * 200}</d>\n" for i in range(N // 220))
    assert seconds(system_passages, text, 200) < 1.0
    assert len(passages_module._complement(system_passages(text, 200), len(text))) <= 8


def test_long_blank_and_fenced_runs_are_read_in_linear_time():
    for text in ("#" + "\n" * N, "\n" + " " * N + "x", "```\n" * (N // 4), "<a " * (N // 3)):
        assert seconds(system_passages, text, 200) < 1.0


SYSTEM_PIECES = st.sampled_from(
    [
        "<a>",
        "</a>",
        '<doc id="1">',
        "</doc>",
        "<a",
        ">",
        "Context:",
        "context",
        "Documents",
        "## Sources",
        "# ",
        "#",
        "Note:",
        "A:",
        "[1]",
        " 2",
        ":",
        "```",
        "~~~",
        "\n",
        "\n\n",
        " ",
        "\t",
        "\u00a0",
        "\x1c",
        "word ",
        "y" * 40,
    ]
)


@settings(max_examples=1500, deadline=None)
@given(st.lists(SYSTEM_PIECES, max_size=24), st.integers(0, 60), st.integers(0, 4))
def test_system_passages_are_those_the_old_searches_found(pieces, min_chars, max_pieces):
    text = "".join(pieces)
    assert passages_module._tagged(text) == old_tagged(text)
    assert passages_module._sections(text) == old_sections(text)
    assert system_passages(text, min_chars, max_pieces) == old_passages(text, min_chars, max_pieces)


@settings(max_examples=1500)
@given(st.lists(st.sampled_from(["context", "#", " ", "\t", "\n", ":", "1", "[", "]", "x"])))
def test_document_headings_are_those_the_old_pattern_found(pieces):
    text = "".join(pieces)
    new = [m.span() for m in passages_module._HEADING.finditer(text)]
    assert new == [m.span() for m in OLD_HEADING.finditer(text)]


@settings(max_examples=1000)
@given(st.text(alphabet=" \t\n\u00a0\u2028\x1c\x85ab", max_size=20), st.data())
def test_trimmed_lengths_are_those_of_strip(text, data):
    begin = data.draw(st.integers(0, len(text)))
    end = data.draw(st.integers(begin, len(text)))
    assert passages_module._trimmed_length(text)(begin, end) == len(text[begin:end].strip())


# ----------------------------------------------------------------------------- stop strings


def old_released(stops: tuple[str, ...], pieces: list[str]) -> tuple[list[str], str, bool]:
    """The decoder's stop-string release as it was: the whole text kept, each stop
    searched for and each held-back prefix length tried after every piece."""
    text, sent, out = "", 0, []
    for piece in pieces:
        text += piece
        hits = [i for i in (text.find(s, sent) for s in stops) if i >= 0]
        if hits:
            out.append(text[sent : min(hits)])
            return out, "", True
        hold = 0
        for s in stops:
            for k in range(min(len(s) - 1, len(text) - sent), hold, -1):
                if text.endswith(s[:k]):
                    hold = k
                    break
        out.append(text[sent : len(text) - hold])
        sent = len(text) - hold
    return out, text[sent:], False


def released(stops: tuple[str, ...], pieces: list[str]) -> tuple[list[str], str, bool]:
    scanner = StopScanner(stops)
    out = []
    for piece in pieces:
        out.append(scanner.feed(piece))
        if scanner.stopped:
            break
    return out, scanner.rest(), scanner.stopped


def test_a_long_answer_is_scanned_for_many_long_stop_strings_in_linear_time():
    # the last stop holds back 255 characters after every token; each of the others
    # shares none of that tail, so the old release tried all 254 prefix lengths of each
    stops = (*(c + "a" * 254 for c in "bcdefghijklmnop"), "a" * 255 + "z")
    pieces = ["a"] * N
    assert seconds(released, stops, pieces) < 1.0
    out, rest, stopped = released(stops, pieces)
    assert not stopped and "".join(out) == "a" * (N - 255) and rest == "a" * 255
    out, rest, stopped = released(stops, [*pieces, "z", "tail"])
    assert stopped and "".join(out) == "a" * (N - 255) and rest == ""


@settings(max_examples=2000, deadline=None)
@given(
    st.lists(st.text(alphabet="abc", min_size=1, max_size=5), max_size=4),
    st.lists(st.text(alphabet="abc", max_size=4), max_size=12),
)
def test_released_text_is_what_the_old_release_gave(stops, pieces):
    assert released(tuple(stops), pieces) == old_released(tuple(stops), pieces)
