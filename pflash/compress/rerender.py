"""Locating a message's characters in the rendered prompt by rendering the chat again.

Chat templates differ in how they frame a message, so the planner finds a system message,
the tool definitions or the latest user content by difference: render the chat without the
message (or with a sentinel inside its content) and compare with the prompt
(`changed_char_span`, `locate_content_by_sentinel`, the reference's marker-less fallback).
`Rerender` holds the request's chat and the prompt text those renders are compared with.
All positions are characters of the prompt text.
"""

from __future__ import annotations

from collections.abc import Sequence

from pflash.compress.chat import ChatInput, target_text, trim_span
from pflash.errors import CompressionFailed, InvalidRequest

SENTINEL_BEGIN = "__LUCE_PFLASH_CONTENT_BEGIN_02C47F91__"
SENTINEL_END = "__LUCE_PFLASH_CONTENT_END_6E6B61A8__"


# --------------------------------------------------------------------------- re-render pins


class Rerender:
    """Re-renders of the request's chat, as the target prefills them (characters).

    The prompt text must be exactly the rendering of the messages (the same template,
    tools and thinking switch): spans located by difference are wrong otherwise, so a
    mismatch fails with stage "span_validation". When the rendering already equals the
    prompt text, the target's encode/decode round trip is the identity on it and
    re-renders skip it.
    """

    def __init__(self, chat: ChatInput, target_tokenizer, prompt_text: str):
        self.chat = chat
        self.target = target_tokenizer
        self.prompt_text = prompt_text
        rendered = chat.render(target_tokenizer)
        self.round_trip = rendered != prompt_text
        if self.round_trip and target_text(target_tokenizer, rendered) != prompt_text:
            raise CompressionFailed(
                "span_validation",
                "the prompt text is not the target's rendering of the messages "
                "(template, tools or chat_template_kwargs differ)",
            )

    def text(self, *, messages: Sequence[dict] | None = None, drop_tools: bool = False) -> str:
        rendered = self.chat.render(self.target, messages=messages, drop_tools=drop_tools)
        return target_text(self.target, rendered) if self.round_trip else rendered

    def message_chars(self, index: int) -> tuple[int, int] | None:
        """Characters message `index` adds to the prompt: re-render without it and diff.

        A template that cannot render the chat without it falls back to locating its
        content with sentinels. None when the template does not render the message at all.
        """
        without = [m for k, m in enumerate(self.chat.messages) if k != index]
        try:
            if not without:
                raise InvalidRequest("no message left")
            changed = changed_char_span(self.prompt_text, self.text(messages=without))
            return with_content(
                self.prompt_text, changed, self.chat.messages[index]["content"].strip()
            )
        except InvalidRequest:
            located = locate_content_by_sentinel(
                self.chat, index, self.target, self.prompt_text, round_trip=self.round_trip
            )
            if located is None:
                role = self.chat.messages[index]["role"]
                raise CompressionFailed(
                    "span_validation", f"cannot locate the {role} message {index} in the prompt"
                ) from None
            return located

    def tools_chars(self) -> tuple[int, int] | None:
        # Tool JSON is re-serialised by the template, so there is no literal to widen with.
        """Characters the tool definitions add: re-render with no tools and diff."""
        return changed_char_span(self.prompt_text, self.text(drop_tools=True))

    def content_chars(self, index: int) -> tuple[int, int] | None:
        return locate_content_by_sentinel(
            self.chat, index, self.target, self.prompt_text, round_trip=self.round_trip
        )


def with_content(
    text: str, changed: tuple[int, int] | None, content: str
) -> tuple[int, int] | None:
    """Widen a removal diff to the whole literal content it cut into.

    A template that substitutes a default when a message is removed (SmolLM2 and Laguna
    insert a default system prompt) makes the diff skip the words both texts share ("You
    are"); the occurrence of the message's own content that overlaps the diff restores them.
    """
    if changed is None or not content:
        return changed
    begin, end = changed
    pos = text.find(content, max(0, begin - len(content) + 1))
    while 0 <= pos < end:
        if pos + len(content) > begin:
            return min(begin, pos), max(end, pos + len(content))
        pos = text.find(content, pos + 1)
    return changed


# --------------------------------------------------------------------------- re-render location


def changed_char_span(full: str, without: str) -> tuple[int, int] | None:
    """Characters of `full` that `without` lacks: [begin, end), or None when they are equal.

    A removed block can often be aligned in several places (the inserted
    `<|im_start|>system…<|im_end|>\\n` shares its first marker with the next turn). The
    result is the union of the prefix-first and the suffix-first alignments, so it covers
    the removed block wherever the template put it, plus at most the ambiguous repeat.
    """
    if full == without:
        return None
    limit = min(len(full), len(without))
    p = _common_prefix(full, without)
    s = _common_suffix(full, without)
    begin = min(p, limit - s)
    end = len(full) - min(s, limit - p)
    return (begin, end) if end > begin else None


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    lo = 0
    step = 4096
    while lo < n and a[lo : lo + step] == b[lo : lo + step]:
        lo += step
    hi = min(lo + step, n)
    while lo < hi and a[lo] == b[lo]:
        lo += 1
    return min(lo, n)


def _common_suffix(a: str, b: str) -> int:
    return _common_prefix(a[::-1], b[::-1])


def locate_content_by_sentinel(
    chat: ChatInput, index: int, target_tokenizer, prompt_text: str, *, round_trip: bool = True
) -> tuple[int, int] | None:
    """Characters [begin, end) of message `index`'s content in `prompt_text` (reference §5.3).

    Re-renders with `SENTINEL_BEGIN` prepended to (and, separately, `SENTINEL_END` appended
    to) that message's content. When removing the sentinel from the re-render gives back
    the prompt, its position is exact; otherwise the common prefix (suffix) length with the
    prompt is used, as the reference does. The range is whitespace-trimmed; None when the
    content cannot be located (empty or inconsistent).
    """

    def rendered(with_sentinel: str, before: bool) -> str:
        messages = [dict(m) for m in chat.messages]
        content = messages[index]["content"]
        messages[index]["content"] = with_sentinel + content if before else content + with_sentinel
        text = chat.render(target_tokenizer, messages=messages)
        return target_text(target_tokenizer, text) if round_trip else text

    with_begin = rendered(SENTINEL_BEGIN, True)
    k = with_begin.find(SENTINEL_BEGIN)
    if k >= 0 and with_begin[:k] + with_begin[k + len(SENTINEL_BEGIN) :] == prompt_text:
        begin = k
    else:
        begin = _common_prefix(with_begin, prompt_text)
    with_end = rendered(SENTINEL_END, False)
    k = with_end.find(SENTINEL_END)
    if k >= 0 and with_end[:k] + with_end[k + len(SENTINEL_END) :] == prompt_text:
        end = k
    else:
        end = len(prompt_text) - _common_suffix(with_end, prompt_text)
    if not (0 <= begin <= end <= len(prompt_text)):
        return None
    b, e = trim_span(prompt_text, begin, end)
    return (b, e) if e > b else None
