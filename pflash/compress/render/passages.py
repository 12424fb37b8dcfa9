"""Documents inside system and developer messages: which characters are instructions
(kept verbatim) and which are passages (scored and dropped like user context).

Why: RAG applications put their retrieved documents in the system message. Pinning the whole
system prompt, as the reference does, serves such a prompt uncompressed (keep 1.0, TTFT equal
to full prefill). The instructions around the documents must still reach the target word for
word, so only material that is recognisably a document becomes droppable:

- the inside of an XML-style block, `<documents>…</documents>`, `<doc id=3>…</doc>`;
- the inside of a code fence (three backticks or tildes);
- a section introduced by a heading line such as `Context:`, `Documents:`, `Sources:`,
  `Reference material:` or a Markdown heading with one of those words, up to the next
  blank-line-separated heading or the end (a closing paragraph of at most 300 characters
  stays an instruction: "Answer in French." after the documents);
- any paragraph longer than twice `min_chars` with no delimiter at all (a pasted article
  is not an instruction; a long persona paragraph usually is, hence the higher bar), unless
  it is a list (most of its lines bullets or numbered items: an agent harness lists its
  skills, agents and rules so, and a pasted document rarely is one long list).

Only passages of at least `min_chars` characters count, so a short example inside tags stays
an instruction. Instruction blocks (`instruction_blocks`: `<system-reminder>`, the tool
block, ...) are never passages, whatever rule found them. Positions are characters of the message content; the result is sorted and
non-overlapping. At most `max_pieces` instruction pieces remain per message (the shortest
passages between them are kept verbatim instead), so a message never turns into more pinned
spans than the selector allows.
"""

from __future__ import annotations

import heapq
import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence

from pflash.compress.text.instruction_blocks import instruction_blocks

TRAILING_INSTRUCTION_CHARS = 300
_TAG = re.compile(r"<([A-Za-z][\w.-]{0,40})(?:\s[^<>]{0,200})?>")
_CLOSE_TAG = re.compile(r"</([A-Za-z][\w.-]{0,40})>")
_FENCE = re.compile(r"^(```|~~~)[^\n]*\n", re.MULTILINE)
_HEADING_WORDS = (
    "context",
    "contexts",
    "document",
    "documents",
    "documentation",
    "sources",
    "source",
    "references",
    "reference",
    "reference material",
    "retrieved",
    "retrieved documents",
    "search results",
    "knowledge",
    "knowledge base",
    "background",
    "data",
    "files",
    "file",
    "passages",
    "excerpts",
)
_HEADING = re.compile(
    r"^(?:#{1,6}\s*)?(?:" + "|".join(re.escape(w) for w in _HEADING_WORDS) + r")"
    # `\s*:\s*$|\s*$`, not `\s*:?\s*$`: the same matches, but the two stars around an
    # optional colon retried every split of a long run of spaces (quadratic)
    r"(?:\s+\d+|\s*\[\d+\])?(?:\s*:\s*$|\s*$)",
    re.IGNORECASE | re.MULTILINE,
)
_HEADING_LINE = re.compile(r"^(?:#{1,6}\s+\S.*|[A-Z][\w /-]{0,40}:)\s*$", re.MULTILINE)
_HEADING_LINE_START = re.compile(r"^[#A-Z]", re.MULTILINE)


def passages(
    content: str, min_chars: int, max_pieces: int = 8, instruction_tags: Sequence[str] = ()
) -> list[tuple[int, int]]:
    """Character ranges of `content` that are documents rather than instructions; the
    blocks tagged with `instruction_tags` are never part of one."""
    found = [
        *_tagged(content),
        *_fenced(content),
        *_sections(content),
        *_long_paragraphs(content, 2 * min_chars),
    ]
    found = _without(found, instruction_blocks(content, instruction_tags))
    trimmed = _trimmed_length(content)
    kept = _merge([(b, e) for b, e in found if trimmed(b, e) >= min_chars])
    return _at_most_pieces(kept, len(content), max_pieces)


def instruction_ranges(
    content: str, min_chars: int, max_pieces: int = 8, instruction_tags: Sequence[str] = ()
) -> list[tuple[int, int]]:
    """The complement of `passages` in [0, len(content)): what stays verbatim."""
    return _complement(passages(content, min_chars, max_pieces, instruction_tags), len(content))


def _without(ranges: list[tuple[int, int]], holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`ranges` with the characters of `holes` (sorted, disjoint) taken out."""
    if not holes:
        return ranges
    starts = [b for b, _ in holes]
    out = []
    for b, e in ranges:
        i = max(0, bisect_right(starts, b) - 1)
        at = b
        while i < len(holes) and holes[i][0] < e:
            hb, he = holes[i]
            if he > at:
                if hb > at:
                    out.append((at, hb))
                at = max(at, he)
            i += 1
        if at < e:
            out.append((at, e))
    return out


def _complement(ranges: list[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    out, at = [], 0
    for b, e in ranges:
        if b > at:
            out.append((at, b))
        at = e
    if at < n:
        out.append((at, n))
    return out


def _tagged(text: str) -> list[tuple[int, int]]:
    """Insides of `<tag …>…</tag>` blocks: each opening tag to the first close of its name.

    The close positions of every name are collected in one pass and each name's list is
    walked once, so many opening tags without a close cost no search to the end each."""
    closes: dict[str, list[int]] = {}
    for c in _CLOSE_TAG.finditer(text):  # close tags cannot overlap: none holds a `<`
        closes.setdefault(c.group(1), []).append(c.start())
    passed: dict[str, int] = {}  # per name: how many of its closes lie before this tag
    out = []
    for m in _TAG.finditer(text):
        name = m.group(1)
        at = closes.get(name, [])
        i = passed.get(name, 0)
        while i < len(at) and at[i] < m.end():
            i += 1
        passed[name] = i
        if i < len(at) and at[i] > m.end():
            out.append((m.end(), at[i]))
    return out


def _fenced(text: str) -> list[tuple[int, int]]:
    out, pos = [], 0
    while True:
        m = _FENCE.search(text, pos)
        if m is None:
            return out
        close = text.find("\n" + m.group(1), m.end())
        if close < 0:
            return out
        out.append((m.end(), close))
        pos = close + 1 + len(m.group(1))


def _sections(text: str) -> list[tuple[int, int]]:
    """A document heading line, then everything to the next heading after a blank line.

    "The next heading" is the first `_HEADING_LINE` match in a scan from the section's
    start that follows a blank line and is no document heading itself. Such a scan visits
    a chain of matches (each starts its successor's search), so the heading lines are read
    once and every match learns, from the last one back, where its chain first ends a
    section: each section then costs one lookup instead of a scan to the end."""
    headings = list(_HEADING.finditer(text))
    if not headings:
        return []
    lines = [
        h for s in _HEADING_LINE_START.finditer(text) if (h := _HEADING_LINE.match(text, s.start()))
    ]
    starts = [h.start() for h in lines]
    # boundary[i]: where the chain of matches from lines[i] first ends a section
    boundary = [len(text)] * (len(lines) + 1)
    for i in range(len(lines) - 1, -1, -1):
        at = starts[i]
        if text[max(0, at - 2) : at] == "\n\n" and not _HEADING.match(text, at):
            boundary[i] = at
        else:
            boundary[i] = boundary[bisect_left(starts, lines[i].end())]
    last = text.rfind("\n\n")
    short_close = last >= 0 and _trimmed_length(text)(last, len(text)) <= TRAILING_INSTRUCTION_CHARS
    out = []
    for m in headings:
        begin = m.end()
        i = bisect_left(starts, begin)
        if i < len(lines) and starts[i] == begin:  # a boundary must start after the heading
            i = bisect_left(starts, lines[i].end())
        end = boundary[i]
        if end == len(text) and last > begin and short_close:
            end = last  # a short closing paragraph is the instructions' last word
        out.append((begin, end))
    return out


_LIST_ITEM = re.compile(r"^[ \t]*(?:[-*+\u2022]|\d{1,3}[.)])[ \t]", re.MULTILINE)
LIST_SHARE = 0.6  # a paragraph whose lines are mostly list items is a list, not an article


def _long_paragraphs(text: str, min_chars: int) -> list[tuple[int, int]]:
    out, at = [], 0
    for m in re.finditer(r"\n\s*\n", text):
        if m.start() - at >= min_chars and not _is_list(text, at, m.start()):
            out.append((at, m.start()))
        at = m.end()
    if len(text) - at >= min_chars and not _is_list(text, at, len(text)):
        out.append((at, len(text)))
    return out


def _is_list(text: str, begin: int, end: int) -> bool:
    """Whether most lines of `text[begin:end]` are bullets or numbered items."""
    lines = text.count("\n", begin, end) + 1
    items = sum(1 for _ in _LIST_ITEM.finditer(text, begin, end))
    return items >= LIST_SHARE * lines


def _trimmed_length(text: str) -> Callable[[int, int], int]:
    """`len(text[begin:end].strip())` without the copy: ranges may nest and overlap (every
    unclosed `<a>` reaches the same close), so copying each would be quadratic."""
    runs = [m.span() for m in re.finditer(r"\S+", text)]
    run_starts = [b for b, _ in runs]
    run_ends = [e for _, e in runs]

    def length(begin: int, end: int) -> int:
        first = bisect_right(run_ends, begin)  # the first run ending after `begin`
        last = bisect_left(run_starts, end) - 1  # the last run starting before `end`
        if begin >= end or first > last:
            return 0
        return min(end, run_ends[last]) - max(begin, run_starts[first])

    return length


def _at_most_pieces(kept: list[tuple[int, int]], n: int, max_pieces: int) -> list[tuple[int, int]]:
    """Drop the shortest passage (the first of equals) until the instructions between the
    rest form at most `max_pieces` pieces. `kept` is sorted and each passage is separated
    from the next, so the pieces are the gaps between neighbours plus a leading and a
    trailing one; a heap finds each shortest without a scan per removal."""
    alive = [True] * len(kept)
    heap = [(e - b, i) for i, (b, e) in enumerate(kept)]
    heapq.heapify(heap)
    count, first, last = len(kept), 0, len(kept) - 1

    def pieces() -> int:
        return count - 1 + (kept[first][0] > 0) + (kept[last][1] < n)

    while count and pieces() > max_pieces:
        _, i = heapq.heappop(heap)
        alive[i] = False
        count -= 1
        while first < len(kept) and not alive[first]:
            first += 1
        while last >= 0 and not alive[last]:
            last -= 1
    return [r for r, keep in zip(kept, alive, strict=True) if keep]


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for b, e in sorted(ranges):
        if out and b <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((b, e))
    return out
