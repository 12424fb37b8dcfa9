"""Chat rendering with the target's template, chat-marker families, and turn parsing.

The pipeline never trusts message boundaries it did not see in the prompt itself: the target
prefills the *text* its chat template produced, so turns are parsed from that text (decoded
target tokens, re-encoded by the drafter), and every index here is a **drafter token** over
the drafter's `TokenizedText` of the prompt (reference ALGORITHM.md §5.3).

Marker resolution "through the target tokenizer". A family's markers are looked up in the
target vocabulary: a marker that is an added/special token of the target is rendered with
the target's own token text (`special=True`); a marker that is not one (Laguna's `<user>` in
most vocabularies, or any family's markers when a test renders a foreign template with the
SmolLM2 tokenizer) is plain text, and its text is the literal marker, because plain text
survives the target's encode/decode round trip unchanged (the prompt text *is* that round
trip). Plain-text markers can also occur inside a user's own words, so when several families
occur in a prompt the one that wins is, in order: the family whose markers appear in the
chat template that rendered the prompt, then the family whose markers are special tokens of
the target, then the family whose first role marker comes earliest. Only the family's
signature role markers (not its tool-output markers) count for that choice.

When no family's markers are in the prompt (Llama 3, Mistral, a custom template), the
latest user message is located by re-rendering it with sentinel strings around its content
(`compress/render/rerender.py`), the reference's marker-less fallback.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pflash.compress.text.encoding import encode_as_written
from pflash.errors import InvalidRequest
from pflash.message_content import content_text
from pflash.spans import Span, TokenizedText, decode_ids

ROLES = ("system", "developer", "user", "assistant", "tool")
ASSISTANT_ROLES = frozenset({"assistant", "model"})
TOOL_OUTPUT_PREFIXES = ("<tool_response>", "<tool_result>")

# apply_chat_template arguments that chat_template_kwargs may not override.
_RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "chat_template",
        "add_generation_prompt",
        "tokenize",
        "return_dict",
        "return_tensors",
        "continue_final_message",
        "enable_thinking",
    }
)


# --------------------------------------------------------------------------- rendering


def normalize_messages(messages: Any) -> list[dict]:
    """Validated copies of OpenAI chat messages, content flattened to a string.

    Roles must be one of `ROLES` (an unknown role is `InvalidRequest`). Content may be a
    string, None, or a list of text parts (`{"type": "text", "text": ...}`), which are
    joined with "\\n" as vLLM does; other part types are rejected (PFlash is text only):
    the API's rule (`pflash.message_content.content_text`), so both refuse the same parts.
    Other keys (tool_calls, tool_call_id, name, reasoning_content) pass through unchanged.
    """
    if not isinstance(messages, Sequence) or isinstance(messages, str | bytes) or not messages:
        raise InvalidRequest("messages must be a non-empty list", param="messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InvalidRequest(f"messages[{i}] must be an object", param="messages")
        role = message.get("role")
        if role not in ROLES:
            raise InvalidRequest(
                f"messages[{i}].role {role!r} is not one of {', '.join(ROLES)}", param="messages"
            )
        copy = dict(message)
        copy["content"] = _flatten_content(message.get("content"), i)
        out.append(copy)
    return out


def _flatten_content(content: Any, index: int) -> str:
    try:
        text = content_text(content)
    except InvalidRequest as err:
        raise InvalidRequest(
            f"messages[{index}].content: {err.message}", param="messages", code=err.code
        ) from None
    return "" if text is None else text


def render_chat(
    tokenizer,
    messages: Any,
    *,
    tools: Sequence[Mapping] | None = None,
    enable_thinking: bool | None = None,
    add_generation_prompt: bool = True,
    chat_template: str | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """Render `messages` with the target tokenizer's chat template (or `chat_template`).

    `tools` and the thinking switch are passed to the template (`enable_thinking=None` leaves
    it undefined, so the template's default applies); `template_kwargs` are further template
    variables (the request's chat_template_kwargs). A template that rejects the messages
    (e.g. roles that do not alternate) is the client's error: `InvalidRequest`.
    """
    normalized = normalize_messages(messages)
    if tools is not None and (not isinstance(tools, Sequence) or isinstance(tools, str)):
        raise InvalidRequest("tools must be a list", param="tools")
    extra = dict(template_kwargs or {})
    clash = sorted(_RESERVED_TEMPLATE_KWARGS & extra.keys())
    if clash:
        raise InvalidRequest(
            f"chat_template_kwargs may not set {', '.join(clash)}", param="chat_template_kwargs"
        )
    if enable_thinking is not None:
        extra["enable_thinking"] = bool(enable_thinking)
    try:
        text = tokenizer.apply_chat_template(
            normalized,
            tools=list(tools) if tools else None,
            chat_template=chat_template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **extra,
        )
    except InvalidRequest:
        raise
    except Exception as err:  # jinja2.TemplateError, or ValueError when there is no template
        raise InvalidRequest(
            f"the chat template rejected the request: {err}", param="messages"
        ) from None
    if not isinstance(text, str):
        raise InvalidRequest("the chat template did not render text", param="messages")
    return text


@dataclass(frozen=True)
class ChatInput:
    """Everything needed to re-render a chat exactly as the target prompt was rendered.

    Re-renders (without a system message, without tools, with a sentinel in the latest user
    content) locate spans by difference, so they must use the same template and variables.
    `template_kwargs` holds the chat_template_kwargs including `enable_thinking`.
    """

    messages: tuple[dict, ...]
    tools: tuple[dict, ...] | None = None
    chat_template: str | None = None
    template_kwargs: tuple[tuple[str, Any], ...] = ()
    add_generation_prompt: bool = True

    @classmethod
    def build(
        cls,
        messages: Any,
        *,
        tools: Sequence[Mapping] | None = None,
        chat_template: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        add_generation_prompt: bool = True,
    ) -> ChatInput:
        if isinstance(
            messages, str
        ):  # Responses-API string input: one user message (§10.2 item 25)
            messages = [{"role": "user", "content": messages}]
        return cls(
            messages=tuple(normalize_messages(messages)),
            tools=tuple(dict(t) for t in tools) if tools else None,
            chat_template=chat_template,
            template_kwargs=tuple(sorted((template_kwargs or {}).items())),
            add_generation_prompt=add_generation_prompt,
        )

    def render(
        self, tokenizer, *, messages: Sequence[dict] | None = None, drop_tools: bool = False
    ) -> str:
        kwargs = dict(self.template_kwargs)
        thinking = kwargs.pop("enable_thinking", None)
        return render_chat(
            tokenizer,
            list(self.messages if messages is None else messages),
            tools=None if drop_tools else self.tools,
            enable_thinking=thinking,
            add_generation_prompt=self.add_generation_prompt,
            chat_template=self.chat_template,
            template_kwargs=kwargs,
        )

    def latest_user_index(self) -> int:
        """The boundary message of the sentinel fallback: the latest user message, else the last."""
        for i in range(len(self.messages) - 1, -1, -1):
            if self.messages[i]["role"] == "user":
                return i
        return len(self.messages) - 1


def target_text(target_tokenizer, rendered: str) -> str:
    """The text the target will prefill for `rendered`: its encode/decode round trip (a
    text comparison, so the markers are read as written)."""
    return decode_ids(target_tokenizer, encode_as_written(target_tokenizer, rendered))


# --------------------------------------------------------------------------- marker families


@dataclass(frozen=True)
class MarkerFamily:
    """One chat-marker convention (reference §5.3 table).

    - `role_markers`: (marker, role); role None means the role name follows the marker
      (≤ 16 ASCII letters, then one optional "\\n").
    - `end_markers`: close the turn they follow.
    - `role_starts_delimit`: a following role marker also closes a turn (DeepSeek, Laguna).
    - `signature`: the role markers that identify the family in a prompt or template.

    Beyond the reference table: DeepSeek's BOS opens the system turn (its system prompt has
    no role marker) and `<｜tool▁outputs▁begin｜>`/`<｜tool▁outputs▁end｜>` delimit a tool turn;
    Laguna's bare `<tool_response>` blocks between turns are tool turns.
    """

    name: str
    role_markers: tuple[tuple[str, str | None], ...]
    end_markers: tuple[str, ...]
    role_starts_delimit: bool
    signature: tuple[str, ...]


QWEN = MarkerFamily("qwen", (("<|im_start|>", None),), ("<|im_end|>",), False, ("<|im_start|>",))
DEEPSEEK = MarkerFamily(
    "deepseek",
    (
        ("<｜begin▁of▁sentence｜>", "system"),
        ("<｜User｜>", "user"),
        ("<｜Assistant｜>", "assistant"),
        ("<｜tool▁outputs▁begin｜>", "tool"),
    ),
    ("<｜end▁of▁sentence｜>", "<｜tool▁outputs▁end｜>"),
    True,
    ("<｜User｜>", "<｜Assistant｜>"),
)
GEMMA = MarkerFamily(
    "gemma",
    (("<start_of_turn>", None), ("<|turn>", None)),
    ("<end_of_turn>", "<turn|>"),
    False,
    ("<start_of_turn>", "<|turn>"),
)
LAGUNA = MarkerFamily(
    "laguna",
    (
        ("<system>", "system"),
        ("<user>", "user"),
        ("<assistant>", "assistant"),
        ("<tool_response>", "tool"),
    ),
    ("</system>", "</user>", "</assistant>", "</tool_response>"),
    True,
    ("<user>", "<assistant>"),
)
FAMILIES = (QWEN, DEEPSEEK, GEMMA, LAGUNA)


@dataclass(frozen=True)
class ResolvedMarker:
    """A marker as the target renders it: `text`, and whether it is one target token."""

    marker: str
    text: str
    special: bool


def resolve_marker(target_tokenizer, marker: str) -> ResolvedMarker:
    """Render `marker` through the target vocabulary (see the module docstring)."""
    added = (
        target_tokenizer.get_added_vocab() if hasattr(target_tokenizer, "get_added_vocab") else {}
    )
    if marker in added:
        return ResolvedMarker(marker, decode_ids(target_tokenizer, [added[marker]]), True)
    return ResolvedMarker(marker, marker, False)


@dataclass(frozen=True)
class _Occurrence:
    begin: int  # characters
    end: int
    marker: str
    role: str | None  # for role markers: the fixed role, or None when a name follows
    is_role: bool


@dataclass(frozen=True)
class _FamilyMatch:
    family: MarkerFamily
    texts: Mapping[str, str]  # marker -> rendered text
    special: bool  # a signature marker is a special token of the target
    in_template: bool
    first: int


def _template_text(target_tokenizer, chat_template: str | None) -> str:
    tpl = (
        chat_template
        if chat_template is not None
        else getattr(target_tokenizer, "chat_template", None)
    )
    if isinstance(tpl, Mapping):
        return "\n".join(str(v) for v in tpl.values())
    return tpl if isinstance(tpl, str) else ""


def detect_family(
    text: str,
    target_tokenizer,
    *,
    chat_template: str | None = None,
    controls: Sequence[tuple[int, int]] | None = None,
) -> _FamilyMatch | None:
    """The marker family of `text`, or None when no family's signature marker occurs in it.

    `controls`: the prompt's control-token ranges; a marker that is a special token of the
    target counts only there (marker text in a message is text). None: every occurrence."""
    template = _template_text(target_tokenizer, chat_template)
    best: _FamilyMatch | None = None
    for family in FAMILIES:
        resolved = {m: resolve_marker(target_tokenizer, m) for m, _ in family.role_markers}
        resolved.update({m: resolve_marker(target_tokenizer, m) for m in family.end_markers})
        found = [(_first(text, resolved[m], controls), m) for m in family.signature]
        found = [(pos, m) for pos, m in found if pos >= 0]
        if not found:
            continue
        match = _FamilyMatch(
            family=family,
            texts={m: r.text for m, r in resolved.items()},
            special=any(resolved[m].special for m in family.signature),
            in_template=any(
                resolved[m].text in template or m in template for m in family.signature
            ),
            first=min(pos for pos, _ in found),
        )
        if best is None or _rank(match) > _rank(best):
            best = match
    return best


def _first(text: str, marker: ResolvedMarker, controls: Sequence[tuple[int, int]] | None) -> int:
    """Where `marker` first occurs in `text` as the prompt's own marker, or -1."""
    if controls is None or not marker.special:
        return text.find(marker.text)
    for b, e in controls:
        if text[b:e] == marker.text:
            return b
    return -1


def _rank(match: _FamilyMatch) -> tuple[bool, bool, int]:
    return (match.in_template, match.special, -match.first)


def _occurrences(
    text: str, match: _FamilyMatch, target_tokenizer, controls: Sequence[tuple[int, int]] | None
) -> list[_Occurrence]:
    """The family's markers in `text`, in order. A marker that is a special token of the
    target counts only where it is one of the prompt's `controls` (when they are known):
    marker text inside a message is the message's words, not a turn."""
    family = match.family
    kinds: dict[str, tuple[str | None, bool]] = {}
    for marker, role in family.role_markers:
        kinds[match.texts[marker]] = (role, True)
    for marker in family.end_markers:
        kinds[match.texts[marker]] = (None, False)
    special = {t for t in kinds if resolve_marker(target_tokenizer, t).special}
    own = None if controls is None else set(controls)
    pattern = re.compile("|".join(re.escape(t) for t in sorted(kinds, key=len, reverse=True)))
    out = []
    for m in pattern.finditer(text):
        if own is not None and m.group(0) in special and m.span() not in own:
            continue
        role, is_role = kinds[m.group(0)]
        out.append(_Occurrence(m.start(), m.end(), m.group(0), role, is_role))
    return out


# --------------------------------------------------------------------------- turns


@dataclass(frozen=True)
class Turn:
    """One chat turn. Token fields are drafter tokens; `char_*` fields are characters of the
    prompt text (the same text the drafter encoded).

    - `role_begin`: the token containing the role marker's first character.
    - `content_begin` / `content_end`: the first token starting at or after the trimmed
      content's first / end character (lower bounds). Empty content: both at the header end.
    - `turn_end`: the next role marker's start, or the end of the closing end marker (lower
      bound); an open last turn ends at S.
    - `closed`: an end marker (or, for delimiting families, a role marker) follows.
    """

    role: str
    role_begin: int
    content_begin: int
    content_end: int
    turn_end: int
    closed: bool
    char_role_begin: int
    char_content_begin: int
    char_content_end: int
    char_turn_end: int

    @property
    def header(self) -> Span:
        """[role_begin, content_begin): the role marker and name, e.g. `<|im_start|>user\\n`."""
        return Span(self.role_begin, self.content_begin)

    @property
    def content(self) -> Span:
        return Span(self.content_begin, self.content_end)

    @property
    def span(self) -> Span:
        return Span(self.role_begin, self.turn_end)

    @property
    def has_content(self) -> bool:
        return self.char_content_end > self.char_content_begin


@dataclass(frozen=True)
class ChatLayout:
    """The parsed turns of one prompt (drafter tokens over S = `n_tokens`).

    - `generation_begin`: role_begin of the open assistant/model turn that ends the prompt
      (the generation prompt, whatever think/channel prefix follows its header), else S.
    - `query_turn_index`: the latest user turn with content, else the latest turn with
      content other than the generation prompt; None when no turn has content.
    - `later_turns`: a turn with content follows the query turn (not counting the
      generation prompt): an agent loop (assistant tool calls, tool output).
    - `special_markers`: the family's markers are special tokens of the target.
    """

    family: str
    turns: tuple[Turn, ...]
    generation_begin: int
    query_turn_index: int | None
    later_turns: bool
    n_tokens: int
    special_markers: bool = False
    generation_turn_index: int | None = field(default=None)

    @property
    def has_generation_prompt(self) -> bool:
        return 0 < self.generation_begin < self.n_tokens

    @property
    def query_turn(self) -> Turn | None:
        return None if self.query_turn_index is None else self.turns[self.query_turn_index]


_ROLE_NAME = re.compile(r"[A-Za-z]{1,16}(?![A-Za-z])")


def parse_chat(
    drafter: TokenizedText, target_tokenizer, *, chat_template: str | None = None
) -> ChatLayout | None:
    """Parse the chat turns of the prompt `drafter.text` (reference §5.3).

    Returns None when no marker family occurs in the text. Indices are drafter tokens.
    Markers that are special tokens of the target are read only at the prompt's controls
    (`drafter.controls`, the template's own markers), so marker text in a message never
    opens a turn.
    """
    text = drafter.text
    controls = drafter.controls
    match = detect_family(text, target_tokenizer, chat_template=chat_template, controls=controls)
    if match is None:
        return None
    occ = _occurrences(text, match, target_tokenizer, controls)
    turns: list[Turn] = []
    for i, o in enumerate(occ):
        if not o.is_role:
            continue
        header_end = o.end
        role = o.role
        if role is None:
            name = _ROLE_NAME.match(text, o.end)
            role = name.group(0).lower() if name else ""
            header_end = name.end() if name else o.end
            if text.startswith("\n", header_end):
                header_end += 1
        nxt = occ[i + 1] if i + 1 < len(occ) else None
        if nxt is None:
            raw_end, turn_end, closed = len(text), len(text), False
        elif nxt.is_role:
            raw_end, turn_end, closed = nxt.begin, nxt.begin, match.family.role_starts_delimit
        else:
            raw_end, turn_end, closed = nxt.begin, nxt.end, True
        cb, ce = trim_span(text, header_end, raw_end)
        if role == "user" and text.startswith(TOOL_OUTPUT_PREFIXES, cb):
            role = "tool"
        turns.append(
            Turn(
                role=role,
                role_begin=drafter.token_containing(o.begin),
                content_begin=drafter.token_at_or_after(cb),
                content_end=drafter.token_at_or_after(ce),
                turn_end=drafter.token_at_or_after(turn_end),
                closed=closed,
                char_role_begin=o.begin,
                char_content_begin=cb,
                char_content_end=ce,
                char_turn_end=turn_end,
            )
        )
    n = len(drafter)
    generation_turn = None
    if turns and not turns[-1].closed and turns[-1].role in ASSISTANT_ROLES:
        generation_turn = len(turns) - 1
    generation_begin = turns[generation_turn].role_begin if generation_turn is not None else n
    query_index = _query_turn_index(turns, generation_turn)
    later = query_index is not None and any(
        t.has_content for k, t in enumerate(turns) if k > query_index and k != generation_turn
    )
    return ChatLayout(
        family=match.family.name,
        turns=tuple(turns),
        generation_begin=generation_begin,
        query_turn_index=query_index,
        later_turns=later,
        n_tokens=n,
        special_markers=match.special,
        generation_turn_index=generation_turn,
    )


def trim_span(text: str, begin: int, end: int) -> tuple[int, int]:
    """Whitespace-trimmed [begin, end) characters; empty content collapses to `begin`."""
    b, e = begin, end
    while b < e and text[b].isspace():
        b += 1
    while e > b and text[e - 1].isspace():
        e -= 1
    return (b, e) if b < e else (begin, begin)


def _query_turn_index(turns: Sequence[Turn], generation_turn: int | None) -> int | None:
    for k in range(len(turns) - 1, -1, -1):
        if turns[k].role == "user" and turns[k].has_content:
            return k
    for k in range(len(turns) - 1, -1, -1):
        if k != generation_turn and turns[k].has_content:
            return k
    return None
