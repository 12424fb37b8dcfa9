"""Code headers in request text: the line that opens the block an indented line belongs to.

Two stages ask, for different ends, so there are two questions here over one rule of
indentation (`indent_width`: a tab counts `TAB_WIDTH` columns):

- `block_header` (lexical anchors): the nearest line above, within `HEADER_WINDOW` lines,
  that is less indented, when it opens any block (`opens_block`: it ends with ":" or "{",
  or starts with a definition keyword). Asked once per anchored line: an `if x:` or a
  `struct S {` above a matched line is context worth keeping next to it.
- `code_lines` (passage evidence): for every line of a range, the innermost *definition*
  (`def`, `class`, `function`, `func`, `fn`) it is the body of, however far above. Asked
  for every passage, to say what a piece of a body belongs to: an `if x:` names nothing
  an embedder can use, a function's name does.

Both are linear over the text: `code_lines` is one pass with a stack of open headers;
`block_header` reads at most `HEADER_WINDOW` lines a call, and lexical asks once per line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

HEADER_WINDOW = 32  # lines searched upwards for an indented line's block header
TAB_WIDTH = 4  # columns a tab counts for in indentation
MAX_INDENT_CHARS = 256  # indentation is read this far: deeper lines all count as this deep

_WORD = re.compile(r"\w+")
BLOCK_KEYWORDS = frozenset(
    "def class function fn func fun async struct impl interface trait module namespace".split()
)
_DEFINITION = re.compile(
    r"[ \t]*(?:(?:async[ \t]+)?def[ \t]+\w+[ \t]*\(|class[ \t]+\w+[ \t]*[:(]"
    r"|(?:export[ \t]+)?(?:async[ \t]+)?function\b|func[ \t]|(?:pub[ \t]+)?fn[ \t]+\w)"
)


def indent_width(text: str, line_start: int) -> int:
    """Leading whitespace width of the line starting at `line_start`, in columns: a space
    counts 1, a tab `TAB_WIDTH`; at most `MAX_INDENT_CHARS` characters are read."""
    width = 0
    for ch in text[line_start : line_start + MAX_INDENT_CHARS]:
        if ch == " ":
            width += 1
        elif ch == "\t":
            width += TAB_WIDTH
        else:
            break
    return width


def opens_block(line: str) -> bool:
    """A line (stripped) that opens an indented block: it ends with ":" or "{", or starts
    with a definition keyword (`BLOCK_KEYWORDS`). Why: in prose an indented paragraph's
    "header" is just the previous paragraph's last line, and keeping it buys nothing."""
    m = _WORD.match(line)
    return line.endswith((":", "{")) or bool(m and m.group() in BLOCK_KEYWORDS)


def block_header(
    text: str, line_start: int, excluded: Sequence[tuple[int, int]] = ()
) -> tuple[int, int] | None:
    """Characters `[begin, end)` of the block header of the line starting at `line_start`
    (its visible characters), or None: the line is not indented, no line within
    `HEADER_WINDOW` lines above is less indented, or the first one that is opens no block
    (`opens_block`) or overlaps an `excluded` character range."""
    indent = indent_width(text, line_start)
    if indent == 0:
        return None
    end = line_start - 1  # the "\n" ending the line above
    for _ in range(HEADER_WINDOW):
        if end < 0:
            return None
        start = text.rfind("\n", 0, end) + 1
        line = text[start:end]
        if line.strip() and indent_width(text, start) < indent:
            lb = start + (len(line) - len(line.lstrip()))
            le = start + len(line.rstrip())
            if opens_block(text[lb:le]) and not any(xb < le and lb < xe for xb, xe in excluded):
                return lb, le
            return None
        end = start - 1
    return None


SIGNATURE_LINES = 32  # lines a definition's signature may span (its brackets still open)


@lru_cache(maxsize=2)
def code_lines(text: str, begin: int, end: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Each non-blank line start of `text[begin:end]` and the start of the innermost
    definition header it is the body of (a `def`/`class`/`function`/`func`/`fn` line above
    it, less indented by `indent_width`), -1 outside any. One pass over the lines, a stack
    of open headers by indentation.

    A signature over several lines (`def f(\n    size: int,\n) -> T:`) is part of its
    header: lines while its brackets are open (at most `SIGNATURE_LINES`) belong to the
    definition and close no block, though `)` sits at the header's indentation. Why: typed
    library code writes most signatures this way, and without it the body after one reads as
    outside any block (Jinja2's `create_cache`).

    Memoized (the last two texts): every passage signal of a request (four a turn) reads the
    code lines of the same prompt text, and a scan of a long prompt is too slow to repeat."""
    starts: list[int] = []
    headers: list[int] = []
    stack: list[tuple[int, int]] = []  # (indent, header char)
    depth, signature = 0, 0  # open brackets of the signature being read, lines left for it
    pos = begin
    while pos < end:
        nl = text.find("\n", pos, end)
        stop = end if nl < 0 else nl
        line = text[pos:stop]
        if signature > 0 and depth > 0:
            if line.strip():
                starts.append(pos)
                headers.append(stack[-1][1])
            depth += _bracket_depth(line)
            signature -= 1
        elif line.lstrip(" \t"):
            indent = indent_width(text, pos)
            while stack and stack[-1][0] >= indent:
                stack.pop()
            starts.append(pos)
            headers.append(stack[-1][1] if stack else -1)
            if _DEFINITION.match(line):
                stack.append((indent, pos))
                depth, signature = _bracket_depth(line), SIGNATURE_LINES
        pos = stop + 1
    return tuple(starts), tuple(headers)


def _bracket_depth(line: str) -> int:
    """Round and square brackets a line opens minus those it closes. Not braces: a
    `function f(a,\n b) {` would stay open for its whole body. Strings and comments are not
    told apart: a signature's lines are bounded by `SIGNATURE_LINES` either way."""
    return line.count("(") + line.count("[") - line.count(")") - line.count("]")
