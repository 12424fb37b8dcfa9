"""The instructions of a chat prompt: what the selector always keeps, verbatim (§5.5).

Instructions are the system and developer messages (but the documents inside them), every
tool definition, and the instruction blocks agent clients write into user and tool turns
(`<system-reminder>`, `<environment_context>`: `compress.text.instruction_blocks`). They are the
same across an agent's steps, so the target's prefix cache holds them, and dropping any of
them breaks the agent rather than speeding it up. Evidence is everything else a turn
carries (tool results, files, command output, pasted and retrieved documents): that is what
is scored and compressed.

Kept apart from the query planner because locating them is its own concern: one wrapped
rendering locates every message that holds instructions together (`Rerender.contents`), with
the reference's per-message renderings as the fallback when a template edits what it is
given. Positions are drafter tokens over the plan's encoding of the prompt text.
"""

from __future__ import annotations

from collections.abc import Sequence

from pflash.compress.render.chat import ASSISTANT_ROLES, ChatInput, ChatLayout
from pflash.compress.render.passages import passages
from pflash.compress.render.rerender import Rerender, deletion_span, with_content
from pflash.compress.text.instruction_blocks import instruction_blocks
from pflash.errors import CompressionFailed
from pflash.spans import MAX_INSTRUCTION_SPANS, Span, TokenizedText, canonicalize

INSTRUCTION_ROLES = ("system", "developer")


def instruction_spans(
    drafter: TokenizedText,
    chat: ChatInput | None,
    rerender: Rerender | None,
    layout: ChatLayout | None,
    passage_chars: int | None = None,
    instruction_tags: Sequence[str] = (),
    tagged: dict[int, list[tuple[int, int]]] | None = None,
) -> tuple[list[Span], list[Span]]:
    """(system, instruction_role) spans (§5.5). System spans are always kept: each
    non-empty system and developer message, the tool definitions, and the
    `instruction_tags` blocks inside user, assistant and tool messages. No span here is
    instruction-role (that group is the dialogue skeleton's, `query._add_skeleton`).

    With `passage_chars`, documents inside a system or developer message (tagged blocks,
    code fences, "Context:" sections, very long paragraphs: `compress.render.passages`; never an
    instruction block) are left out of its pins, so they are scored and dropped like user
    context; None pins every message whole, as the reference does. `tagged`: the
    instruction blocks `tagged_blocks` found, when the caller has them.

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
    if tagged is None:
        tagged = tagged_blocks(chat, instruction_tags)
    located = rerender.contents(wrapped_indices(chat, tagged)) if wanted or tagged else {}
    blocks = _turn_blocks(drafter.text, layout) if located else {}
    for k, ranges in tagged.items():
        for begin, end in _located_blocks(drafter.text, rerender, located, chat, k, ranges):
            system.append(drafter.token_span(begin, end))
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
        content = None
        if passage_chars is not None and len(message["content"]) >= passage_chars:
            content = located[k] if located is not None else rerender.content_chars(k)
        pieces = _without_passages(drafter.text, chars, content, passage_chars, instruction_tags)
        for begin, end in pieces:
            system.append(drafter.token_span(begin, end))
    if chat.tools:
        chars = rerender.tools_chars()
        if chars is not None:
            system.append(drafter.token_span(*chars))
    return system, instruction_role


def tagged_blocks(
    chat: ChatInput, instruction_tags: Sequence[str]
) -> dict[int, list[tuple[int, int]]]:
    """Message index → the instruction blocks in its content (content characters), for
    the messages that are not pinned whole anyway (user, assistant and tool messages)."""
    if not instruction_tags:
        return {}
    out = {}
    for k, message in enumerate(chat.messages):
        if message["role"] in INSTRUCTION_ROLES:
            continue
        found = instruction_blocks(message["content"], instruction_tags)
        if found:
            out[k] = found
    return out


def _located_blocks(
    text: str,
    rerender: Rerender,
    located: dict[int, tuple[int, int] | None] | None,
    chat: ChatInput,
    k: int,
    ranges: list[tuple[int, int]],
) -> list[tuple[int, int]]:
    """The instruction blocks `ranges` of message `k` (content characters) as prompt-text
    characters. The message's content is located (the wrapped rendering, else its own
    sentinel rendering); a template that writes it as given puts every block at the same
    offset. Fail closed: a block that cannot be found in the prompt is a `span_validation`
    failure, never an instruction left to be dropped."""
    content = chat.messages[k]["content"]
    chars = located.get(k) if located is not None else rerender.content_chars(k)
    lead = len(content) - len(content.lstrip())
    out = []
    for b, e in ranges:
        block = content[b:e]
        at = None
        if chars is not None:
            start = chars[0] - lead + b
            if text[start : start + len(block)] == block:
                at = start
            else:  # the template rewrote something before it: look for it in the content
                found = text.find(block, chars[0], chars[1] + 1)
                at = found if found >= 0 else None
        if at is None:
            raise CompressionFailed(
                "span_validation",
                f"cannot locate an instruction block of message {k} in the prompt",
            )
        out.append((at, at + len(block)))
    return out


def _without_passages(
    text: str,
    chars: tuple[int, int],
    content: tuple[int, int] | None,
    passage_chars: int | None,
    instruction_tags: Sequence[str] = (),
) -> list[tuple[int, int]]:
    """The pinned characters `chars` of one message minus the passages of its `content`
    (both prompt-text characters); whitespace-only pieces are dropped."""
    if content is None or passage_chars is None:
        return [chars]
    cb, ce = content
    cut = [
        (cb + b, cb + e)
        for b, e in passages(text[cb:ce], passage_chars, instruction_tags=instruction_tags)
    ]
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
        if m["role"] in INSTRUCTION_ROLES and m["content"].strip()
    ]


def wrapped_indices(chat: ChatInput, tagged: dict[int, list] | None = None) -> list[int]:
    """The messages the one wrapped rendering locates: the pinned ones, those holding
    instruction blocks (`tagged`), and the latest user message (the sentinel fallback's
    boundary), so the planner renders the chat once."""
    return sorted({*pinned_indices(chat), *(tagged or {}), chat.latest_user_index()})


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


def add_skeleton(
    instruction_role: list[Span],
    layout: ChatLayout,
    *,
    prompt_end: bool,
    max_turn_tokens: int,
    system: Sequence[Span] = (),
) -> list[Span]:
    """Add the dialogue skeleton (§5.5) to the instruction-role spans.

    Every turn (but the query turn unless prompt_end) contributes its header; a
    user/assistant/model turn whose content has at most `max_turn_tokens` tokens contributes
    the whole turn ("what the conversation said rather than the material it quoted"), and so
    does a system turn no client message is in (the template's default system prompt, e.g.
    SmolLM2's). A client's system message is pinned by its own spans, its documents left
    out; its header is pinned here, so a served prompt never opens with a system message's
    text but no `<|im_start|>system` (the header is the attention sink, which raw attention
    scores keep and passage evidence does not). Turns are added newest first and the skeleton stops before the canonical list
    would exceed the 64-span limit, so a long conversation keeps its recent skeleton instead
    of failing validation.
    """
    groups: list[list[Span]] = []
    for k, turn in enumerate(layout.turns):
        if k == layout.query_turn_index and not prompt_end:
            continue
        group = [turn.header] if not turn.header.empty else []
        is_dialogue = turn.role == "user" or turn.role in ASSISTANT_ROLES
        if turn.role == "system":
            is_dialogue = not any(s.overlaps(turn.content) for s in system)
        if max_turn_tokens > 0 and is_dialogue and len(turn.content) <= max_turn_tokens:
            group.append(turn.span)
        if group:
            groups.append(group)
    chosen = list(instruction_role)
    for group in reversed(groups):
        if len(canonicalize(chosen + group)) > MAX_INSTRUCTION_SPANS:
            break
        chosen.extend(group)
    return chosen
