"""Tagged instruction blocks inside a message: `<system-reminder>...</system-reminder>`.

Agent clients write instructions to the model into user and tool turns, not only into the
system prompt: Claude Code's `<system-reminder>` blocks (the workspace's git status, its
rules for commits), Codex's `<environment_context>` and `<user_instructions>` (AGENTS.md),
and the tool block PFlash writes for a template that cannot render tools
(`compress.render.tool_prompt`). They are instructions, so they are served verbatim; what such a
turn holds besides them (the user's words, a file, a command's output) stays evidence.

A block is an opening tag of one of the configured names (`instruction_tags`, with or
without attributes) through the first closing tag of the same name after it; an opening tag
with no close is no block. Names match case-sensitively, as the clients write them.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Sequence
from functools import lru_cache


@lru_cache(maxsize=16)
def _patterns(tags: tuple[str, ...]) -> tuple[re.Pattern[str], re.Pattern[str]]:
    names = "|".join(re.escape(t) for t in sorted(tags, key=len, reverse=True))
    return (
        re.compile(rf"<({names})(?:\s[^<>]{{0,200}})?>"),
        re.compile(rf"</({names})>"),
    )


def instruction_blocks(text: str, tags: Sequence[str]) -> list[tuple[int, int]]:
    """Character ranges `[begin, end)` of the instruction blocks in `text`, tags included,
    sorted and disjoint (an opening tag inside a block is part of it).

    Linear in `text` (client text, whatever it holds): one pass finds the opening tags and
    one the closing tags; each opening tag then finds its close by bisection in its name's
    list, so many opening tags without a close cost no scan to the end each."""
    if not tags or "<" not in text:
        return []
    opening, closing = _patterns(tuple(tags))
    closes: dict[str, list[int]] = {}
    for c in closing.finditer(text):
        closes.setdefault(c.group(1), []).append(c.start())
    if not closes:
        return []
    out: list[tuple[int, int]] = []
    for m in opening.finditer(text):
        if out and m.start() < out[-1][1]:
            continue
        at = closes.get(m.group(1))
        if not at:
            continue
        i = bisect_right(at, m.end() - 1)
        if i < len(at):
            out.append((m.start(), at[i] + len(m.group(1)) + 3))
    return out
