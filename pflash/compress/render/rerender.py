"""Locating a message's characters in the rendered prompt by rendering the chat again.

Chat templates differ in how they frame a message, so the planner finds the system and
developer messages and the latest user content with **one** extra rendering of the whole
chat that wraps each of those contents in its own pair of sentinel strings
(`locate_contents`): stripping the sentinels must give back the prompt exactly, and then
every position is exact. The cost is one rendering per request, whatever the number of
messages, so planning stays linear in the chat's length.

When that one rendering does not validate (a template that edits the content it is given),
the planner falls back to the reference's per-message way: render the chat without the
message and diff (`changed_char_span`), or with a sentinel inside one content
(`locate_content_by_sentinel`). The tool definitions are always found by diff (one
rendering without tools): the template re-serialises them, so there is no literal content
to wrap. `Rerender` holds the request's chat and the prompt text those renders are compared
with. All positions are characters of the prompt text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pflash.compress.render.chat import ChatInput, target_text, trim_span
from pflash.errors import CompressionFailed, InvalidRequest

SENTINEL_BEGIN = "__LUCE_PFLASH_CONTENT_BEGIN_02C47F91__"
SENTINEL_END = "__LUCE_PFLASH_CONTENT_END_6E6B61A8__"
# Per-message sentinels of the one wrapped rendering: the message index and which side.
_WRAP = "__LUCE_PFLASH_{side}{index}_5A3D09C2__"
_WRAPPED = re.compile(r"__LUCE_PFLASH_([BE])(\d+)_5A3D09C2__")


# --------------------------------------------------------------------------- re-render pins


class Rerender:
    """Re-renders of the request's chat, as the target prefills them (characters).

    The prompt text must be exactly the rendering of the messages (the same template,
    tools and thinking switch): spans located by difference are wrong otherwise, so a
    mismatch fails with stage "span_validation". When the rendering already equals the
    prompt text, the target's encode/decode round trip is the identity on it and
    re-renders skip it. `checked`: the caller rendered `prompt_text` from this chat itself
    (`RenderedPrompt`), so it is not rendered a second time to compare.
    """

    def __init__(self, chat: ChatInput, target_tokenizer, prompt_text: str, *, checked=False):
        self.chat = chat
        self.target = target_tokenizer
        self.prompt_text = prompt_text
        rendered = prompt_text if checked else chat.render(target_tokenizer)
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

    def contents(self, indices: Sequence[int]) -> dict[int, tuple[int, int] | None] | None:
        """Trimmed content characters of each message in `indices`, from one wrapped
        rendering (`locate_contents`); None when it does not validate (use the per-message
        methods). Cached per set of indices: the planner asks once."""
        key = tuple(sorted(set(indices)))
        cache = self.__dict__.setdefault("_contents", {})
        if key not in cache:
            cache[key] = (
                None
                if self.round_trip
                else locate_contents(self.chat, key, self.target, self.prompt_text)
            )
        return cache[key]


def locate_contents(
    chat: ChatInput, indices: Sequence[int], target_tokenizer, prompt_text: str
) -> dict[int, tuple[int, int] | None] | None:
    """Content characters of the messages `indices` in `prompt_text`, from one rendering.

    The chat is rendered once with each of those contents wrapped in its own begin and end
    sentinel. When removing every sentinel gives back `prompt_text` exactly, each position
    is exact: a message maps to its whitespace-trimmed content, or to None when the template
    did not render it (neither sentinel appears) or its content is blank. The whole result
    is None when the rendering does not validate (a sentinel missing on one side or
    repeated, or the stripped text is not the prompt): the template edits what it is given,
    and the caller falls back to the per-message renderings.
    """
    messages = [dict(m) for m in chat.messages]
    for k in indices:
        begin, end = _WRAP.format(side="B", index=k), _WRAP.format(side="E", index=k)
        messages[k]["content"] = begin + messages[k]["content"] + end
    wrapped = chat.render(target_tokenizer, messages=messages)
    found: dict[tuple[str, int], int] = {}
    pieces: list[str] = []
    last = removed = 0
    for m in _WRAPPED.finditer(wrapped):
        key = (m.group(1), int(m.group(2)))
        if key in found or key[1] not in indices:
            return None
        pieces.append(wrapped[last : m.start()])
        found[key] = m.start() - removed
        removed += m.end() - m.start()
        last = m.end()
    pieces.append(wrapped[last:])
    if "".join(pieces) != prompt_text:
        return None
    out: dict[int, tuple[int, int] | None] = {}
    for k in indices:
        begin, end = found.get(("B", k)), found.get(("E", k))
        if begin is None and end is None:
            out[k] = None
            continue
        if begin is None or end is None or end < begin:
            return None
        b, e = trim_span(prompt_text, begin, end)
        out[k] = (b, e) if e > b else None
    return out


def deletion_span(text: str, begin: int, end: int) -> tuple[int, int] | None:
    """What `changed_char_span(text, text[:begin] + text[end:])` gives, without the copy.

    This is the per-message diff when removing a message deletes exactly its block
    [begin, end) of the prompt (a template that frames each message alike whatever its
    neighbours). The alignment only scans the runs the two texts share around the block,
    so locating many messages stays linear in the prompt.
    """
    if end <= begin:
        return None
    n = len(text)
    limit = n - (end - begin)
    p = begin + _run_forward(text, begin, end)
    s = (n - end) + _run_backward(text, end, begin)
    b = min(p, limit - s)
    e = n - min(s, limit - p)
    return (b, e) if e > b else None


def _run_forward(text: str, i: int, j: int) -> int:
    """Length of the common run of text[i:] and text[j:] (i < j)."""
    run, step = 0, 64
    while j + run < len(text):
        a, b = text[i + run : i + run + step], text[j + run : j + run + step]
        if a == b:
            run += len(b)
            step *= 2
            continue
        k = 0
        while k < len(b) and a[k] == b[k]:
            k += 1
        return run + k
    return run


def _run_backward(text: str, i: int, j: int) -> int:
    """Length of the common run ending at text[:i] and text[:j] (j < i)."""
    run, step = 0, 64
    while j - run > 0:
        size = min(step, j - run)
        a, b = text[i - run - size : i - run], text[j - run - size : j - run]
        if a == b:
            run += size
            step *= 2
            continue
        k = 0
        while k < size and a[size - 1 - k] == b[size - 1 - k]:
            k += 1
        return run + k
    return run


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
