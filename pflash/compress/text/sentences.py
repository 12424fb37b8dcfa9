"""Where sentences end and open in request text: one home for the rules every stage reads.

The marks are the same everywhere: a sentence ends at a run of `SENTENCE_MARKS` (".", "!",
"?"), optionally closed by quotes or brackets (`CLOSERS`); `:` and `;` also open a new
clause for the stages that ask whether a word opens one. Each question below is asked
about a different place in the text, so each has its own function:

- `sentence_ends`: where sentences end inside a line (lexical units, the question tail's
  cut), a mark run followed by whitespace;
- `ends_sentence`: whether a piece already cut (a passage) ends one, where nothing need
  follow it;
- `split_sentences`: the sentences and lines of a short text (the question's parts for the
  embedder), split only where whitespace follows the mark itself;
- `opens_sentence` and `breaks_sentence`: whether a word opens a sentence, asked about one
  word (entity names) or about the gap between two words (lexical key words).

Every one is a scan or a pattern without backtracking over unbounded input: all run on
request text (tests/unit/test_linear_parsers.py).
"""

from __future__ import annotations

import re

SENTENCE_MARKS = ".!?"
CLOSERS = "\"')]"  # may follow a sentence mark and still end the sentence: `"Why?"` `(sic.)`
# with whitespace, what may stand between a sentence's end and the first word of the next
OPENERS = "\"'([*#>-"

# a match starts only at the first mark of a run: tried from every mark of a long run of
# "." or "!" that no space follows, the pattern would be quadratic in the run
_SENTENCE_END = re.compile(r"(?<![.!?])[.!?]++[\"')\]]*+(?=\s)")
_SENTENCE_SPLIT = re.compile(r"(?<=[.?!])\s+|\n+")
_SENTENCE_BREAK = re.compile(r"[.!?:;\n]")


def sentence_ends(text: str, begin: int = 0, end: int | None = None) -> list[int]:
    """Character offsets in `text` where a sentence ends inside `text[begin:end]`: just after
    a run of `SENTENCE_MARKS` and the `CLOSERS` after it, where whitespace follows (the
    offset is that whitespace's). Why whitespace: "3.5", "e.g.," and "U.S.A" end nothing."""
    stop = len(text) if end is None else end
    return [m.end() for m in _SENTENCE_END.finditer(text, begin, stop)]


def ends_sentence(piece: str) -> bool:
    """`piece` ends a sentence or a line: its last visible characters are a sentence mark
    (`CLOSERS` after it aside), or its trailing whitespace holds a newline. Unlike
    `sentence_ends`, nothing need follow: the piece was already cut (a passage), and the
    next one may start with its own space. A scan from the end (a search for the pattern
    `\\n\\s*$` is quadratic in a run of newlines)."""
    body = piece.rstrip()
    if "\n" in piece[len(body) :]:
        return True
    return body.rstrip(CLOSERS).endswith(tuple(SENTENCE_MARKS))


def split_sentences(text: str) -> list[str]:
    """The sentences and lines of `text`, stripped, empty ones dropped: cut at whitespace
    right after a sentence mark and at newlines. Unlike `sentence_ends`, a mark closed by a
    quote or bracket does not cut: a question part quoting `"Why?" she asked` stays whole."""
    return [p.strip() for p in _SENTENCE_SPLIT.split(text) if p.strip()]


def opens_sentence(text: str, at: int) -> bool:
    """Whether a word at `at` opens a sentence or a line: only whitespace and `OPENERS`
    stand between it and the text's start, a newline, or a ".!?:;" (a sentence mark may be
    followed by a closing quote or bracket). A scan back over those marks, so each character is read
    once per word it precedes: searching the whole text before every word would be quadratic."""
    j = at
    while j > 0 and (text[j - 1].isspace() or text[j - 1] in OPENERS):
        j -= 1
    if j == 0 or "\n" in text[j:at]:
        return True
    if text[j - 1] in ".!?:;":
        return True
    return text[j - 1] in ")]" and j >= 2 and text[j - 2] in SENTENCE_MARKS


def breaks_sentence(text: str, begin: int, end: int) -> bool:
    """Whether `text[begin:end]`, the gap between two words, holds a ".!?:;" or a newline, so
    the word after it opens a sentence. Unlike `opens_sentence`, any mark in the gap counts,
    not only the last before the word ("3.5 Km", "it.), Km"): lexical key words walk a
    range's words and read each gap once. Kept apart from `opens_sentence` on purpose: made
    one, the lexical anchors (which words name something) would change on such gaps."""
    return _SENTENCE_BREAK.search(text, begin, end) is not None
