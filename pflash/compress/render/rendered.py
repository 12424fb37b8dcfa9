"""The prompt a request asks the target to prefill, rendered once (`RenderedPrompt`).

A chat is rendered with the target's chat template and encoded once here (and once more
without the generation prompt, to find the snapshot cut); every later stage (the gate, the
plan, the view keys) reads this object instead of rendering or encoding the prompt again,
and a drafter with the target's tokenizer reads its encoding as its own. The planner renders
the chat again only to locate messages inside it, never the prompt itself: one rendering
with the pinned contents wrapped in sentinels and one without the first message
(`compress.render.rerender`). Only the template's own markers become control
tokens: marker text in a message stays text (`compress.text.encoding`). A raw completion is its
own prompt: text encoded as written, with the tokenizer's special tokens (a BOS where the
tokenizer adds one), or token ids as sent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from pflash.compress.render.chat import render_chat
from pflash.compress.render.tool_prompt import template_support, tools_in_text
from pflash.compress.text.encoding import (
    ControlledText,
    encode,
    encode_with_offsets,
    find_controls,
    has_control_text,
    is_control_token,
    mark_strings,
    unmark,
)
from pflash.compress.text.encoding_memo import EncodingMemo
from pflash.errors import InvalidRequest
from pflash.spans import TokenizedText, Tokenizer, decode_ids

PromptKind = Literal["chat", "completion"]


@dataclass(frozen=True)
class RenderedPrompt:
    """One request's prompt in the target's vocabulary.

    - `ids`: target tokens, exactly what the target prefills when nothing is compressed;
    - `snapshot_cut`: target index where the generation prompt starts (chat only, None when
      the rendering without it is not a token prefix): the target may keep a KV snapshot of
      everything before it, which the conversation's next turn extends;
    - `messages` / `tools` / `template_kwargs`: the chat inputs that rendered it (None for a
      raw completion), for the planner's pinned spans;
    - `text` (lazy): the target text of `ids` (decoded once, on first use);
    - `encoding`: for a chat, the encoding `ids` were made with (the template's output, its
      character offsets and control ranges): the planner reads it instead of encoding the
      text again where the drafter shares the target's tokenizer, and instead of rendering
      the chat again to check the text is the messages' rendering.
    """

    kind: PromptKind
    ids: tuple[int, ...]
    tokenizer: Tokenizer = field(repr=False, compare=False)
    snapshot_cut: int | None = None
    messages: Sequence[Mapping] | None = None
    tools: Sequence[Mapping] | None = None
    template_kwargs: Mapping[str, Any] | None = None
    encoding: TokenizedText | None = field(default=None, repr=False, compare=False)

    @cached_property
    def text(self) -> str:
        return decode_ids(self.tokenizer, self.ids)


def render_chat_prompt(
    tokenizer: Tokenizer,
    messages: Sequence[Mapping],
    *,
    tools: Sequence[Mapping] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    memo: EncodingMemo | None = None,
    scope: str = "",
) -> RenderedPrompt:
    """A chat rendered with the target's template (generation prompt added) and encoded
    with no special tokens added (the template writes them) and only the template's own
    markers as control tokens. The snapshot cut is where the rendering without the
    generation prompt ends, when that is a token prefix. `memo` and `scope` (the tenant):
    the pieces of the conversation encoded by its earlier turns are not encoded again.

    A template that does not render tools (or earlier tool calls) gets them written into
    the messages (`tool_prompt.tools_in_text`); `messages` and `tools` of the result are
    what was rendered."""
    support = template_support(
        lambda m, t: render_chat(tokenizer, m, tools=t), str(tokenizer.chat_template or "")
    )
    messages, tools = tools_in_text(messages, tools, support)
    kwargs = dict(template_kwargs or {})
    thinking = kwargs.pop("enable_thinking", None)
    full = render_chat_controlled(
        tokenizer, messages, tools=tools, enable_thinking=thinking, template_kwargs=kwargs
    )
    encoded = encode_with_offsets(tokenizer, full.text, full.controls, memo=memo, scope=scope)
    ids = encoded.ids
    head = render_chat_controlled(
        tokenizer,
        messages,
        tools=tools,
        enable_thinking=thinking,
        template_kwargs=kwargs,
        add_generation_prompt=False,
    )
    cut = prefix_cut(tokenizer, encoded, head)
    if cut is None:  # not shown by the shortcut: encode the rendering without it and compare
        head_ids = encode(tokenizer, head.text, head.controls)
        cut = len(head_ids) if tuple(head_ids) == ids[: len(head_ids)] else None
    if cut is not None and not 0 < cut < len(ids):
        cut = None
    return RenderedPrompt(
        "chat",
        ids,
        tokenizer,
        snapshot_cut=cut,
        messages=messages,
        tools=tools,
        template_kwargs=template_kwargs,
        encoding=encoded,
    )


def render_chat_controlled(
    tokenizer,
    messages: Any,
    *,
    tools: Sequence[Mapping] | None = None,
    enable_thinking: bool | None = None,
    add_generation_prompt: bool = True,
    chat_template: str | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> ControlledText:
    """`render_chat`, with the character ranges of the template's own control tokens.

    Marker text in the client's strings (message content, tool calls and definitions,
    template variables) stays text: when there is any, the chat is rendered once more with
    that text wrapped in private-use marks (`encoding.mark_strings`) and the unwrapped
    markers are the template's. A template that rewrites the marked text (so the two
    renderings differ once the marks are removed), or client strings holding the marks
    themselves, make the request an `InvalidRequest`: no turn is ever guessed.
    """
    kwargs = dict(template_kwargs or {})
    text = render_chat(
        tokenizer,
        messages,
        tools=tools,
        enable_thinking=enable_thinking,
        add_generation_prompt=add_generation_prompt,
        chat_template=chat_template,
        template_kwargs=kwargs,
    )
    if not has_control_text(tokenizer, [messages, tools, kwargs]):
        return ControlledText(text, find_controls(tokenizer, text))
    marked = render_chat(
        tokenizer,
        mark_strings(tokenizer, messages),
        tools=mark_strings(tokenizer, tools),
        enable_thinking=enable_thinking,
        add_generation_prompt=add_generation_prompt,
        chat_template=chat_template,
        template_kwargs=mark_strings(tokenizer, kwargs),
    )
    controlled = unmark(tokenizer, marked)
    if controlled.text != text:
        raise InvalidRequest(
            "the chat template rewrites the marker text in the messages, so it cannot be "
            "kept as text",
            param="messages",
        )
    return controlled


def prefix_cut(tokenizer, encoded: TokenizedText, head: ControlledText) -> int | None:
    """The length of `head`'s encoding when it is the first tokens of `encoded` (the chat with
    its generation prompt), shown without encoding all of `head` again; None when not shown.

    Encoding splits text at control tokens and encodes the pieces between them (with what
    a control token may take of its neighbours) on their own (`encoding.encode_with_offsets`),
    so when `head`'s text is a prefix of the full text with the same control ranges and a
    control token of the full encoding starts where it ends, every piece of `head` sits
    between the same control tokens in both texts except its last one, which there meets a
    control token and here the end of the text. That last piece (from `head`'s last
    control token on) is encoded again and compared. Why: re-encoding the whole conversation
    for this cut would be a second full tokenization per request.
    """
    end = len(head.text)
    full = encoded.text
    if end >= len(full) or not full.startswith(head.text) or encoded.controls is None:
        return None
    before = tuple(c for c in encoded.controls if c[0] < end)
    if tuple(head.controls) != before or not before or before[-1][1] > end:
        return None
    at = next(((b, e) for b, e in encoded.controls if b == end), None)
    if at is None or not is_control_token(tokenizer, full[at[0] : at[1]]):
        return None
    k = encoded.token_at_or_after(end)
    if k >= len(encoded.ids) or encoded.offsets[k] != at:
        return None
    last_b, last_e = before[-1]
    j = encoded.token_at_or_after(last_b)
    if j >= k or encoded.offsets[j] != (last_b, last_e):
        return None
    tail = encode(tokenizer, head.text[last_b:], [(0, last_e - last_b)])
    return k if tuple(encoded.ids[j:k]) == tuple(tail) else None


def render_completion_prompt(tokenizer: Tokenizer, prompt: str | Sequence[int]) -> RenderedPrompt:
    """A raw completion prompt: text encoded as written with the tokenizer's special tokens
    (the client writes its own markers; the plain encode is `encoding.encode_as_written`
    plus the BOS), or token ids checked against the vocabulary (an id outside it is a 400
    naming `prompt`)."""
    if isinstance(prompt, str):
        return RenderedPrompt(
            "completion", tuple(tokenizer(prompt, add_special_tokens=True)["input_ids"]), tokenizer
        )
    vocab = len(tokenizer)
    if any(t < 0 or t >= vocab for t in prompt):
        raise InvalidRequest(f"prompt token ids must be in [0, {vocab})", param="prompt")
    return RenderedPrompt("completion", tuple(prompt), tokenizer)
