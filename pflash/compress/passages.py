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
  is not an instruction; a long persona paragraph usually is, hence the higher bar).

Only passages of at least `min_chars` characters count, so a short example inside tags stays
an instruction. Positions are characters of the message content; the result is sorted and
non-overlapping. At most `max_pieces` instruction pieces remain per message (the shortest
passages between them are kept verbatim instead), so a message never turns into more pinned
spans than the selector allows.
"""

from __future__ import annotations

import re

TRAILING_INSTRUCTION_CHARS = 300
_TAG = re.compile(r"<([A-Za-z][\w.-]{0,40})(?:\s[^<>]{0,200})?>")
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
    r"(?:\s+\d+|\s*\[\d+\])?\s*:?\s*$",
    re.IGNORECASE | re.MULTILINE,
)
_HEADING_LINE = re.compile(r"^(?:#{1,6}\s+\S.*|[A-Z][\w /-]{0,40}:)\s*$", re.MULTILINE)


def passages(content: str, min_chars: int, max_pieces: int = 8) -> list[tuple[int, int]]:
    """Character ranges of `content` that are documents rather than instructions."""
    found = [
        *_tagged(content),
        *_fenced(content),
        *_sections(content),
        *_long_paragraphs(content, 2 * min_chars),
    ]
    kept = _merge([(b, e) for b, e in found if _trimmed_length(content, b, e) >= min_chars])
    while kept and len(_complement(kept, len(content))) > max_pieces:
        kept.remove(min(kept, key=lambda r: r[1] - r[0]))
    return kept


def instruction_ranges(content: str, min_chars: int, max_pieces: int = 8) -> list[tuple[int, int]]:
    """The complement of `passages` in [0, len(content)): what stays verbatim."""
    return _complement(passages(content, min_chars, max_pieces), len(content))


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
    """Insides of balanced `<tag …>…</tag>` blocks (outermost of each name)."""
    out = []
    for m in _TAG.finditer(text):
        close = text.find(f"</{m.group(1)}>", m.end())
        if close > m.end():
            out.append((m.end(), close))
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
    """A document heading line, then everything to the next heading after a blank line."""
    out = []
    for m in _HEADING.finditer(text):
        begin = m.end()
        end = len(text)
        for h in _HEADING_LINE.finditer(text, begin):
            if h.start() > begin and text[max(0, h.start() - 2) : h.start()] == "\n\n":
                if not _HEADING.match(text, h.start()):
                    end = h.start()
                    break
        if end == len(text):  # a short closing paragraph is the instructions' last word
            last = text.rfind("\n\n", begin)
            if last > begin and len(text[last:].strip()) <= TRAILING_INSTRUCTION_CHARS:
                end = last
        out.append((begin, end))
    return out


def _long_paragraphs(text: str, min_chars: int) -> list[tuple[int, int]]:
    out, at = [], 0
    for m in re.finditer(r"\n\s*\n", text):
        if m.start() - at >= min_chars:
            out.append((at, m.start()))
        at = m.end()
    if len(text) - at >= min_chars:
        out.append((at, len(text)))
    return out


def _trimmed_length(text: str, begin: int, end: int) -> int:
    return len(text[begin:end].strip())


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for b, e in sorted(ranges):
        if out and b <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((b, e))
    return out
