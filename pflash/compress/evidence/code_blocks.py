"""Code blocks read whole: a function's passages scored, and kept, as one function.

Why: a question that describes code in its own words ("which routine merges adjacent and
overlapping subnets?") is about a function, and the sentence embedder reads the context in
24-token passages, of which none says what the function does: the header names it, the
docstring says it in other words, the body does it. The function's whole text, embedded
once, ranks the described function higher than its best passage does
(docs/BENCHMARK_NOTEBOOK.md, "Code read, and kept, by the function"). And an answer needs the
function, not only its `def` line: ranked passage by passage, the `def` line usually survives
a low keep ratio and the whole function rarely does.

Three pure steps, around the drafter call as the passages are:

- `passage_blocks` (prepare): the passages grouped by the innermost definition (`def`,
  `class`, `function`, `func`, `fn`; `code_headers.code_lines`) they are the body of, with
  the passage holding the header line; a block of one passage is left out (that passage is
  scored as it is).
- `block_texts` (prepare): what the embedder reads for each block: its text from the header
  on, the first `BLOCK_MAX_CHARS` characters (the embedder reads at most 256 word pieces).
- `lift_blocks` (finish): each passage of a block scores at least the block's own score, so
  a block the question describes is ranked, and kept, as a whole where the budget holds it.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pflash.compress.text.code_headers import code_lines
from pflash.spans import Span, TokenizedText

# characters of a block's text the embedder is given: ~256 word pieces of code; a longer
# function is read by its header, docstring and first lines, which say what it is for
BLOCK_MAX_CHARS = 512


@dataclass(frozen=True)
class CodeBlock:
    """One definition's passages: `header` the character its header line starts at,
    `span` drafter tokens from the header's passage to the block's last passage,
    `passages` their indices (source order, the header's passage first)."""

    header: int
    span: Span
    passages: tuple[int, ...]


def passage_headers(drafter: TokenizedText, spans: Sequence[tuple[int, int]]) -> list[int]:
    """For each passage (char spans, source order), the start of the header line of the
    innermost code block its first visible character is in (a piece often opens with the
    newline and indentation of the line before), -1 outside any block (`code_lines`)."""
    if not spans:
        return []
    text = drafter.text
    lines, headers = code_lines(text, spans[0][0], spans[-1][1])
    out = []
    for b, e in spans:
        first = b + len(text[b:e]) - len(text[b:e].lstrip())
        line = bisect.bisect_right(lines, first) - 1
        out.append(headers[line] if line >= 0 else -1)
    return out


def passage_blocks(drafter: TokenizedText, passages: Sequence[Span]) -> tuple[CodeBlock, ...]:
    """The code blocks of `passages` (source order of their headers): per definition
    header, the passage holding it and the passages whose innermost block it opens. A
    header no passage holds (it is pinned) opens no block; nor does one with no body
    passage. One pass over the passages (a passage joins at most its own block and, holding
    a header, that header's)."""
    spans = [drafter.char_span(p) for p in passages]
    begins = [b for b, _ in spans]
    members: dict[int, list[int]] = {}
    for i, header in enumerate(passage_headers(drafter, spans)):
        if header < 0:
            continue
        h = bisect.bisect_right(begins, header) - 1
        if h < 0 or header >= spans[h][1]:
            continue  # the header is in no passage (pinned)
        group = members.setdefault(header, [h])
        if i != group[-1]:
            group.append(i)
    out = []
    for header in sorted(members):
        idx = members[header]
        if len(idx) > 1:
            out.append(
                CodeBlock(header, Span(passages[idx[0]].begin, passages[idx[-1]].end), tuple(idx))
            )
    return tuple(out)


def block_texts(drafter: TokenizedText, blocks: Sequence[CodeBlock]) -> tuple[str, ...]:
    """Each block's text as the embedder reads it: from its header line on, at most
    `BLOCK_MAX_CHARS` characters (bounded per block, so the texts are linear in the
    passages whatever the nesting)."""
    text = drafter.text
    out = []
    for block in blocks:
        end = drafter.char_span(block.span)[1]
        out.append(text[block.header : min(end, block.header + BLOCK_MAX_CHARS)])
    return tuple(out)


# a small block's passages rise to this share of its best, plus the rest of their own (as
# `bridge.lift_groups`): the block keeps its own order inside, so where the budget cuts it the
# best part stays; and it stays below the best passages and `def` lines of blocks nearly as
# good (a lift nearer the best loses the described function's `def` line in more development
# cases, and a lower one keeps no more blocks whole; docs/BENCHMARK_NOTEBOOK.md, "Code read,
# and kept, by the function")
WHOLE_LIFT = 0.8


def lift_blocks(
    values: np.ndarray,
    blocks: Sequence[CodeBlock],
    block_values: np.ndarray,
    *,
    whole_tokens: int = 0,
) -> np.ndarray:
    """Per-passage scores where each passage of a block scores at least the block's score
    (`block_values`, on the passages' scale), and the passages of a block of at most
    `whole_tokens` drafter tokens at least `WHOLE_LIFT` of its best passage's (or of its own
    score, whichever is higher) plus the rest of their own.

    Why: selection ranks passages, and a described function's docstring wins a place while
    its `def` line and body lose theirs to near misses: ranked passage by passage, the whole
    function rarely survives a low keep ratio. Lifted together, the function the
    question is about is kept as a whole where the budget holds it. A block larger than
    `whole_tokens` would spend the budget on its first lines: only the block score lifts
    it, and its best passages rank as they are."""
    out = np.asarray(values, dtype=np.float64).copy()
    for block, v in zip(blocks, np.asarray(block_values, dtype=np.float64), strict=True):
        idx = list(block.passages)
        own = out[idx]
        if len(block.span) <= whole_tokens:
            best = max(float(v), float(own.max()))
            out[idx] = np.maximum(own, WHOLE_LIFT * best + (1.0 - WHOLE_LIFT) * own)
        else:
            out[idx] = np.maximum(own, float(v))
    return out
