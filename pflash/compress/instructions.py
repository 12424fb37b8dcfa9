"""System, developer and tool spans of a chat prompt: what the selector always keeps (§5.5).

Kept apart from the query planner because locating them is its own concern: one wrapped
rendering locates every system and developer message together (`Rerender.contents`), with
the reference's per-message renderings as the fallback when a template edits what it is
given. Positions are drafter tokens over the plan's encoding of the prompt text.
"""

from __future__ import annotations

from pflash.compress.chat import ChatInput, ChatLayout
from pflash.compress.passages import passages
from pflash.compress.rerender import Rerender, deletion_span, with_content
from pflash.spans import Span, TokenizedText


def instruction_spans(
    drafter: TokenizedText,
    chat: ChatInput | None,
    rerender: Rerender | None,
    layout: ChatLayout | None,
    passage_chars: int | None = None,
) -> tuple[list[Span], list[Span]]:
    """(system, instruction_role) spans (§5.5): each non-empty system message → system;
    each developer message and the tool definitions → instruction_role.

    With `passage_chars`, documents inside a system or developer message (tagged blocks,
    code fences, "Context:" sections, very long paragraphs: `compress.passages`) are left
    out of its pins, so they are scored and dropped like user context; None pins every
    message whole, as the reference does.

    The messages are located together by one wrapped rendering (`Rerender.contents`). A
    later message the marker parse frames as its own turn of the same role pins that whole
    turn, aligned as the reference's removal diff aligns it (`deletion_span`); one the
    template merges into another turn pins its content. The first message's removal is
    rendered (one more rendering, whatever the chat's length). When the wrapped rendering
    does not validate, each message is located by rendering the chat without it
    (`Rerender.message_chars`), the reference's way."""
    system: list[Span] = []
    instruction_role: list[Span] = []
    if chat is None:
        return system, instruction_role
    wanted = pinned_indices(chat)
    located = rerender.contents(wrapped_indices(chat)) if wanted else {}
    blocks = _turn_blocks(drafter.text, layout) if located else {}
    for k in wanted:
        message = chat.messages[k]
        if located is None:
            chars = rerender.message_chars(k)
        elif k == 0:
            # The first message is where templates substitute defaults (SmolLM2's default
            # system prompt, Llama 3's date header, tools merged into the system turn), so
            # its removal is rendered for real; its content when that changes nothing.
            chars = rerender.message_chars(k) or located[k]
        else:
            chars = located[k]
            block = blocks.get((message["role"], chars)) if chars is not None else None
            if block is not None:
                chars = with_content(
                    drafter.text, deletion_span(drafter.text, *block), message["content"].strip()
                )
        if chars is None:
            continue
        group = system if message["role"] == "system" else instruction_role
        content = None
        if passage_chars is not None and len(message["content"]) >= passage_chars:
            content = located[k] if located is not None else rerender.content_chars(k)
        for begin, end in _without_passages(drafter.text, chars, content, passage_chars):
            group.append(drafter.token_span(begin, end))
    if chat.tools:
        chars = rerender.tools_chars()
        if chars is not None:
            instruction_role.append(drafter.token_span(*chars))
    return system, instruction_role


def _without_passages(
    text: str,
    chars: tuple[int, int],
    content: tuple[int, int] | None,
    passage_chars: int | None,
) -> list[tuple[int, int]]:
    """The pinned characters `chars` of one message minus the passages of its `content`
    (both prompt-text characters); whitespace-only pieces are dropped."""
    if content is None or passage_chars is None:
        return [chars]
    cb, ce = content
    cut = [(cb + b, cb + e) for b, e in passages(text[cb:ce], passage_chars)]
    if not cut:
        return [chars]
    pieces, at = [], chars[0]
    for b, e in cut:
        if b > at:
            pieces.append((at, min(b, chars[1])))
        at = max(at, e)
    if at < chars[1]:
        pieces.append((at, chars[1]))
    return [(b, e) for b, e in pieces if e > b and text[b:e].strip()]


def pinned_indices(chat: ChatInput) -> list[int]:
    """The messages pinned as instructions: non-empty system and developer messages."""
    return [
        k
        for k, m in enumerate(chat.messages)
        if m["role"] in ("system", "developer") and m["content"].strip()
    ]


def wrapped_indices(chat: ChatInput) -> list[int]:
    """The messages the one wrapped rendering locates: the pinned ones and the latest user
    message (the sentinel fallback's boundary), so the planner renders the chat once."""
    return sorted({*pinned_indices(chat), chat.latest_user_index()})


def _turn_blocks(
    text: str, layout: ChatLayout | None
) -> dict[tuple[str, tuple[int, int]], tuple[int, int]]:
    """(role, content chars) → the turn's block: its role marker to the next role marker
    (the end marker and the whitespace after it included), for each parsed turn."""
    if layout is None:
        return {}
    out = {}
    for turn in layout.turns:
        end = turn.char_turn_end
        while end < len(text) and text[end].isspace():
            end += 1
        out[(turn.role, (turn.char_content_begin, turn.char_content_end))] = (
            turn.char_role_begin,
            end,
        )
    return out
