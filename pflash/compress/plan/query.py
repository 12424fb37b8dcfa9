"""Scorer query windows and pinned spans for one prompt: the plan the scorer and selector use.

Everything here is in **drafter tokens** over `Plan.drafter.ids` (the drafter's encoding
of the target prompt text). Reference: ALGORITHM.md §5.3-§5.6.

`plan_prompt` fails closed: a query, `pflash_query` or `pflash_required` string that
cannot be located, or pinned spans that do not validate, raise `CompressionFailed` naming
the stage; the request is never served with a guessed query or an unprotected span.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pflash.compress.render.chat import (
    ChatInput,
    ChatLayout,
    parse_chat,
)
from pflash.compress.render.instructions import (
    add_skeleton,
    instruction_spans,
    tagged_blocks,
    wrapped_indices,
)
from pflash.compress.render.rerender import Rerender
from pflash.compress.text import encoding
from pflash.compress.text.sentences import sentence_ends
from pflash.config import SelectionConfig
from pflash.errors import CompressionFailed, InvalidRequest
from pflash.spans import (
    MAX_INSTRUCTION_SPANS,
    Span,
    TokenizedText,
    canonicalize,
    validate_spans,
)

WindowKind = Literal["main", "turn", "history"]

QUERY_RULES = (
    "explicit_query_span",
    "prompt_end",
    "semantic_suffix",
    "chat_user_tail",
    "content_tail",
    "prompt_tail",
)


@dataclass(frozen=True)
class QueryWindow:
    """One scorer query window (drafter tokens) and its weight in the mass mix (§3.3)."""

    span: Span
    weight: float
    kind: WindowKind


@dataclass(frozen=True)
class Plan:
    """What the scorer queries with and what must never be dropped, for one prompt.

    - `query_span`: the whole query span (pinned). `query`: the main scorer window, the last
      min(query_tokens, len(query_span)) tokens of it: `[query_begin, query_end)`.
    - `turn_query`: tail of the latest user turn (prompt_end rule), weight 1, used only when
      it ends at or before `query.begin`.
    - `history`: earlier questions, most recent first; entry i has weight 2^-(i+1) and an
      entry that is None or does not end at or before `query.begin` is skipped **but still
      consumes its weight slot** (reference §3.3, §12 item 4).
    - `required` / `system`: always kept. `instruction_role`: kept when they fit the
      context, else scored as ordinary context (§5.5, §5.7).
    - `query_suffix_candidates`: agent loop: tokens after the query are scored candidates
      instead of being kept structurally.
    - `generation_begin`: where the generation prompt starts (drafter tokens); S when the
      prompt has chat markers but no open assistant turn; None without chat markers.
    - `layout`: the parsed chat turns (None without markers). `content`: the latest user
      content as located for the query (markers, sentinel re-render, or the whole raw text).
    - `input_kind`: "messages" or "raw_text"; `query_parser`: the parser that applied.
    """

    drafter: TokenizedText
    query_span: Span
    query: Span
    query_rule: str
    turn_query: Span | None = None
    history: tuple[Span | None, ...] = ()
    required: tuple[Span, ...] = ()
    system: tuple[Span, ...] = ()
    instruction_role: tuple[Span, ...] = ()
    query_suffix_candidates: bool = False
    generation_begin: int | None = None
    layout: ChatLayout | None = None
    content: Span | None = None
    input_kind: str = "raw_text"
    query_parser: str = "arbitrary_tail"

    @property
    def n_tokens(self) -> int:
        return len(self.drafter.ids)

    def windows(self) -> tuple[QueryWindow, ...]:
        """Weighted windows for the head scorer, in the reference's order and weights."""
        out = [QueryWindow(self.query, 1.0, "main")]
        if (
            self.turn_query is not None
            and not self.turn_query.empty
            and self.turn_query.end <= self.query.begin
        ):
            out.append(QueryWindow(self.turn_query, 1.0, "turn"))
        for i, h in enumerate(self.history):
            if h is None or h.empty or h.end > self.query.begin:
                continue
            out.append(QueryWindow(h, 0.5 ** (i + 1), "history"))
        return tuple(out)

    def pinned(self, *, include_instruction_role: bool = True) -> tuple[Span, ...]:
        """Canonical union of the spans that are kept structurally."""
        groups = [self.required, self.system]
        if include_instruction_role:
            groups.append(self.instruction_role)
        return canonicalize(s for g in groups for s in g)


# --------------------------------------------------------------------------- text -> token spans


def map_last_occurrence(
    drafter: TokenizedText, needle: str, char_begin: int = 0, char_end: int | None = None
) -> Span | None:
    """Token span covering the **last** occurrence of `needle` inside characters
    [char_begin, char_end) of the prompt text, or None (reference `pflash_decoded_text_span`).

    The span runs from the token containing the needle's first character to the first token
    starting at or after its end, so it covers the needle even across token boundaries.
    """
    pos = last_occurrence(drafter.text, needle, char_begin, char_end)
    if pos < 0:
        return None
    return drafter.token_span(pos, pos + len(needle))


def last_occurrence(text: str, needle: str, begin: int = 0, end: int | None = None) -> int:
    """Start of the last occurrence of `needle` inside `text[begin:end]` (an index into
    `text`), or -1; -1 for an empty needle. Linear in the window and the needle: both are
    client text (`pflash_query`, `pflash_required`), and `str.rfind` is a reverse scan that
    costs O(window * needle) on "ab" + "a" * 40000 in "a" * 80000, while `str.find` switches
    to the two-way algorithm on long inputs, so the search runs forward over both reversed."""
    lo, hi, _ = slice(begin, end).indices(len(text))
    if not needle or hi - lo < len(needle):
        return -1
    at = text[lo:hi][::-1].find(needle[::-1])
    return -1 if at < 0 else hi - at - len(needle)


def find_query_window(
    prompt_ids: Sequence[int],
    query_ids: Sequence[int],
    max_tokens: int,
    *,
    search_end: int,
    search_begin: int = 0,
    anchored: bool,
) -> Span | None:
    """Locate a query's token suffix in the prompt (reference `find_pflash_query_window`).

    widest = min(max_tokens, |query|), narrowest = min(4, widest): a match shorter than 4
    tokens is accepted only for a query that short (a 3-token hit of a long query is a weak
    punctuation match).
    - anchored (a query derived from the prompt): for w from widest down to narrowest, the
      query's last w tokens must equal prompt[search_end - w, search_end). A BPE merge at the
      content's first token narrows the window instead of failing; a match that does not end
      at `search_end` (the same words in an earlier turn) is never taken.
    - unanchored (explicit text): the latest occurrence of the query's w-token suffix inside
      [search_begin, search_end); up to 2 trailing query tokens may be trimmed (a BPE merge
      with the closing marker), the untrimmed suffix preferred.
    """
    q = list(query_ids)
    widest = min(max_tokens, len(q))
    if widest <= 0 or search_end <= search_begin:
        return None
    narrowest = min(4, widest)
    if anchored:
        for w in range(widest, narrowest - 1, -1):
            lo = search_end - w
            if lo >= search_begin and list(prompt_ids[lo:search_end]) == q[-w:]:
                return Span(lo, search_end)
        return None
    for trim in range(0, 3):
        usable = len(q) - trim
        for w in range(min(widest, usable), narrowest - 1, -1):
            suffix = q[usable - w : usable]
            for lo in range(search_end - w, search_begin - 1, -1):
                if list(prompt_ids[lo : lo + w]) == suffix:
                    return Span(lo, lo + w)
    return None


def _tail(span: Span, n: int) -> Span | None:
    """The last min(n, len) tokens of `span`, or None when it is empty."""
    if span.empty:
        return None
    return Span(max(span.begin, span.end - n), span.end)


# --------------------------------------------------------------------------- the planner


def plan_prompt(
    *,
    prompt_text: str,
    drafter_tokenizer,
    target_tokenizer,
    config: SelectionConfig,
    messages: Sequence[Mapping] | str | None = None,
    tools: Sequence[Mapping] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    pflash_query: str | None = None,
    pflash_required: Sequence[str] = (),
    chat_template: str | None = None,
    add_generation_prompt: bool = True,
    controls: Sequence[tuple[int, int]] | None = None,
    rendered: TokenizedText | None = None,
) -> Plan:
    """Plan scorer queries and pinned spans for one prompt (reference §5.3-§5.6).

    - `prompt_text`: the target prompt decoded to text (chat template applied), exactly what
      the target prefills. It is re-encoded here with the drafter tokenizer.
    - `messages` / `tools` / `chat_template_kwargs` / `chat_template` /
      `add_generation_prompt`: for a chat request, the inputs that rendered `prompt_text`
      (needed to pin system, developer and tool text by re-rendering, and for the sentinel
      fallback); `messages=None` for a raw completion. A string `messages` is Responses-API
      input: one user message.
    - `pflash_query`: explicit query text, mapped to its last occurrence before the end of
      the latest user content; `pflash_required`: strings mapped to their last occurrence in
      the latest user content. Either not found → `CompressionFailed` (client error, 400).
    - `controls`: the character ranges of `prompt_text` that are control tokens in the
      target's ids (`encoding.decode`); None reads the text as written (every marker text a
      control token). Marker text outside them stays text for the drafter and the turns.
    - `rendered`: the target's encoding made when the chat was rendered from these inputs
      (`RenderedPrompt.encoding`). When its text and controls are `prompt_text`'s, the
      chat is not rendered again to check it, and a drafter with the target's tokenizer
      reads it as its own encoding (the same text, controls and encoder: the same tokens).

    Raises `InvalidRequest` for bad input (pflash_required with the legacy selector, unknown
    roles) and `CompressionFailed` (stage query_mapping / required_mapping /
    span_validation) when the plan cannot be made exactly.
    """
    required_texts = _required_texts(pflash_required, config)
    query_text = pflash_query.strip() if isinstance(pflash_query, str) else ""
    if controls is None:
        controls = encoding.find_controls(target_tokenizer, prompt_text)
    controls = tuple(controls)
    if rendered is not None and (rendered.text, rendered.controls) != (prompt_text, controls):
        rendered = None
    if rendered is not None and encoding.same_tokenizer(drafter_tokenizer, target_tokenizer):
        drafter = rendered
    else:
        drafter = encoding.encode_with_offsets(drafter_tokenizer, prompt_text, controls)
    n = len(drafter)
    if n == 0:
        raise CompressionFailed(
            "query_mapping", "the prompt encodes to no drafter tokens", client_error=True
        )
    chat = None
    if messages is not None:
        chat = ChatInput.build(
            messages,
            tools=tools,
            chat_template=chat_template,
            template_kwargs=chat_template_kwargs,
            add_generation_prompt=add_generation_prompt,
        )
    rerender = (
        Rerender(chat, target_tokenizer, prompt_text, checked=rendered is not None)
        if chat is not None
        else None
    )
    layout = parse_chat(drafter, target_tokenizer, chat_template=chat_template)
    if chat is None and layout is not None and not layout.has_generation_prompt:
        layout = None  # raw text with marker-like strings but no chat prompt: plain text
    parser = config.select_query_parser if chat is not None else "arbitrary_tail"
    q = config.select_query_tokens

    tagged = tagged_blocks(chat, config.instruction_tags) if chat is not None else {}
    content_chars = _locate_user_content(drafter, layout, chat, rerender, parser, tagged)
    content = Span(
        drafter.token_at_or_after(content_chars[0]), drafter.token_at_or_after(content_chars[1])
    )
    if query_text:
        search_begin = content_chars[0] if parser == "latest_user" else 0
        rule, query_span, turn_query = (
            "explicit_query_span",
            _map_explicit_query(drafter, query_text, search_begin, content_chars[1]),
            None,
        )
    else:
        rule, query_span, turn_query = _derive_query(
            drafter, layout, chat, content, parser, config, drafter_tokenizer
        )
    query = Span(max(query_span.begin, query_span.end - q), query_span.end)
    prompt_end = rule == "prompt_end"
    history = _history_windows(
        layout, prompt_end=prompt_end, query_tokens=q, limit=config.chat_history_queries
    )
    required, suffix_candidates = _required_spans(
        drafter, layout, content, content_chars, query_span, prompt_end, required_texts
    )
    if prompt_end and config.chat_question_pin_tokens > 0:
        question = question_tail(drafter, content_chars, config.chat_question_pin_tokens)
        if question is not None:
            required.append(question)
    system, instruction_role = instruction_spans(
        drafter,
        chat,
        rerender,
        layout,
        passage_chars=config.system_passage_chars
        if config.system_documents == "compress"
        else None,
        instruction_tags=config.instruction_tags,
        tagged=tagged,
    )
    if layout is not None:
        instruction_role = add_skeleton(
            instruction_role,
            layout,
            prompt_end=prompt_end,
            max_turn_tokens=config.chat_skeleton_tokens,
            system=system,
        )
    return Plan(
        drafter=drafter,
        query_span=query_span,
        query=query,
        query_rule=rule,
        turn_query=turn_query,
        history=history,
        required=_validated("required", required, n),
        system=_validated("system", system, n),
        instruction_role=_validated("instruction_role", instruction_role, n),
        query_suffix_candidates=suffix_candidates,
        generation_begin=layout.generation_begin if layout is not None else None,
        layout=layout,
        content=content,
        input_kind="messages" if chat is not None else "raw_text",
        query_parser=parser,
    )


def _map_explicit_query(drafter: TokenizedText, query_text: str, begin: int, end: int) -> Span:
    """`pflash_query` → its last occurrence in characters [begin, end); the whole span is
    pinned and the scorer uses its last query_tokens tokens (rule explicit_query_span)."""
    span = map_last_occurrence(drafter, query_text, begin, end)
    if span is None:
        raise CompressionFailed(
            "query_mapping",
            f"pflash_query {query_text[:80]!r} does not occur in the prompt before the end of "
            "the latest user message",
            client_error=True,
            param="pflash_query",
        )
    return span


def _derive_query(
    drafter: TokenizedText,
    layout: ChatLayout | None,
    chat: ChatInput | None,
    content: Span,
    parser: str,
    config: SelectionConfig,
    drafter_tokenizer,
) -> tuple[str, Span, Span | None]:
    """(rule, query span, turn window) without an explicit query, in the reference's order
    (§5.4): prompt_end for a chat prompt with a generation prompt (strict, arbitrary_tail);
    semantic_suffix under latest_user (the user's text anchored at its sentinel-located end,
    else content_tail); chat_user_tail with markers; content_tail for a marker-less chat;
    prompt_tail for raw text. No window is a server-side mapping failure."""
    n, q = len(drafter), config.select_query_tokens
    turn_query = None
    if (
        config.strict
        and parser == "arbitrary_tail"
        and layout is not None
        and layout.has_generation_prompt
    ):
        rule, query_span = "prompt_end", Span(n - 1, n)
        if layout.query_turn is not None or chat is not None:
            turn_query = _tail(content, q)
    elif parser == "latest_user" and chat is not None:
        user_text = chat.messages[chat.latest_user_index()]["content"].strip()
        query_ids = encoding.encode_text(drafter_tokenizer, user_text)
        window = find_query_window(
            drafter.ids,
            query_ids,
            q,
            search_begin=content.begin,
            search_end=content.end,
            anchored=True,
        )
        rule, query_span = (
            ("semantic_suffix", window) if window else ("content_tail", _tail(content, q))
        )
    elif layout is not None and layout.query_turn is not None:
        rule, query_span = "chat_user_tail", _tail(content, q)
    elif chat is not None:
        rule, query_span = "content_tail", _tail(content, q)
    else:
        rule, query_span = "prompt_tail", _tail(Span(0, n), q)
    if query_span is None or query_span.empty:
        raise CompressionFailed(
            "query_mapping", f"PFlash scorer query mapping failed (rule {rule}: no content)"
        )
    return rule, query_span, turn_query


def question_tail(
    drafter: TokenizedText, content_chars: tuple[int, int], max_tokens: int
) -> Span | None:
    """The question that closes the latest user turn, to keep verbatim (drafter tokens).

    The reference pins only the generation prompt and scores the user turn's last tokens,
    so a fixed chunk edge can cut the question itself ("...ka number?"), and a small target
    then answers something else. This pins the turn's last line; when that line is longer
    than `max_tokens`, its last whole sentences that fit; failing that, its last
    `max_tokens` tokens. None when the content is empty.
    """
    begin_c, end_c = content_chars
    text = drafter.text[begin_c:end_c].rstrip()
    if not text.strip():
        return None
    end = begin_c + len(text)
    line_start = begin_c + text.rfind("\n") + 1
    end_tok = drafter.token_at_or_after(end)
    start = drafter.token_containing(line_start)
    if end_tok - start <= max_tokens:
        return Span(start, end_tok)
    floor_tok = max(drafter.token_containing(line_start), end_tok - max_tokens)
    floor_c = drafter.offsets[floor_tok][0] if floor_tok < len(drafter) else end
    tail = drafter.text[floor_c:end]
    # cut at the space after a sentence's end: byte-level BPE tokens carry their leading space
    cuts = [c for c in sentence_ends(tail) if tail[c] == " "]
    if cuts:
        return Span(drafter.token_at_or_after(floor_c + cuts[0]), end_tok)
    return Span(floor_tok, end_tok)


def _required_spans(
    drafter: TokenizedText,
    layout: ChatLayout | None,
    content: Span,
    content_chars: tuple[int, int],
    query_span: Span,
    prompt_end: bool,
    required_texts: Sequence[str],
) -> tuple[list[Span], bool]:
    """Always-kept spans (§5.5) and whether the agent-loop suffix is scored.

    The query span; each pflash_required string at its last occurrence in the latest user
    content; with prompt_end the whole generation prompt; the query turn's role header; and
    in an agent loop (turns after the query turn, query inside the user content) the rest of
    the user turn through its closing marker and the generation prompt, while the turns in
    between become scored candidates.
    """
    n = len(drafter)
    required = [query_span]
    for text in required_texts:
        span = map_last_occurrence(drafter, text, content_chars[0], content_chars[1])
        if span is None:
            raise CompressionFailed(
                "required_mapping",
                f"pflash_required {text[:80]!r} does not occur in the latest user message",
                client_error=True,
                param="pflash_required",
            )
        required.append(span)
    query_turn = layout.query_turn if layout is not None else None
    if prompt_end:
        required.append(Span(layout.generation_begin, n))
    if query_turn is not None:
        required.append(query_turn.header)
    agent_loop = (
        query_turn is not None
        and layout.later_turns
        and content.begin <= query_span.begin
        and query_span.end <= content.end
    )
    if agent_loop:
        required.append(Span(query_span.end, query_turn.turn_end))
        required.append(Span(layout.generation_begin, n))
    return required, agent_loop


def _required_texts(pflash_required: Any, config: SelectionConfig) -> tuple[str, ...]:
    if pflash_required is None:
        return ()
    if isinstance(pflash_required, str) or not isinstance(pflash_required, Sequence):
        raise InvalidRequest("pflash_required must be a list of strings", param="pflash_required")
    if not all(isinstance(s, str) for s in pflash_required):
        raise InvalidRequest("pflash_required must be a list of strings", param="pflash_required")
    texts = tuple(s.strip() for s in pflash_required if s.strip())
    if texts and not config.strict:
        raise InvalidRequest(
            "pflash_required needs strict selection; the server runs select_mode legacy",
            param="pflash_required",
        )
    return texts


def _locate_user_content(
    drafter: TokenizedText,
    layout: ChatLayout | None,
    chat: ChatInput | None,
    rerender: Rerender | None,
    parser: str,
    tagged: dict[int, list] | None = None,
) -> tuple[int, int]:
    """Characters of the latest user content: the sentinel re-render under the latest_user
    parser or when no turn with content was parsed; the marker-parsed query turn otherwise;
    the whole text for raw input. `tagged`: the messages with instruction blocks, which the
    same wrapped rendering locates (`instructions.wrapped_indices`)."""
    if chat is not None and (
        parser == "latest_user" or layout is None or layout.query_turn is None
    ):
        index = chat.latest_user_index()
        wrapped = rerender.contents(wrapped_indices(chat, tagged))
        located = wrapped[index] if wrapped is not None else rerender.content_chars(index)
        if located is None:
            if not chat.messages[index].get("content"):
                # an empty message renders nothing to find (a chat of one empty system
                # message): the question is empty, at the end of the prompt
                return len(drafter.text), len(drafter.text)
            raise CompressionFailed(
                "query_mapping", "cannot locate the latest user message in the prompt"
            )
        return located
    if layout is not None and layout.query_turn is not None:
        turn = layout.query_turn
        return turn.char_content_begin, turn.char_content_end
    return 0, len(drafter.text)


def _history_windows(
    layout: ChatLayout | None, *, prompt_end: bool, query_tokens: int, limit: int
) -> tuple[Span | None, ...]:
    """Earlier questions, most recent first (§5.6). prompt_end: the last token of the header
    of the reply that followed each earlier user turn (the earlier question's analogue of the
    prompt's last token); otherwise the tail of that user turn. None keeps a weight slot."""
    if layout is None or layout.query_turn_index is None or limit <= 0:
        return ()
    turns = layout.turns
    out: list[Span | None] = []
    for k in range(layout.query_turn_index - 1, -1, -1):
        if len(out) >= limit:
            break
        turn = turns[k]
        if turn.role != "user" or not turn.has_content:
            continue
        if prompt_end:
            reply = turns[k + 1] if k + 1 < len(turns) else None
            if (
                reply is not None
                and reply.role != "user"
                and reply.content_begin > reply.role_begin
            ):
                out.append(Span(reply.content_begin - 1, reply.content_begin))
            else:
                out.append(None)
        else:
            out.append(_tail(turn.content, query_tokens))
    return tuple(out)


def _validated(name: str, spans: Sequence[Span], n_tokens: int) -> tuple[Span, ...]:
    """Canonical, in range, and for `required` and `instruction_role` at most the reference's
    64 spans (the client's strings, the skeleton's cap). Instructions have no such bound: an
    agent's harness repeats its reminders turn after turn, and each is kept."""
    canon = canonicalize(spans)
    limit = len(canon) if name == "system" else MAX_INSTRUCTION_SPANS
    reason = validate_spans(canon, n_tokens, limit)
    if reason is not None:
        too_many_required = name == "required" and len(canon) > MAX_INSTRUCTION_SPANS
        raise CompressionFailed(
            "span_validation",
            f"{name} spans: {reason}",
            client_error=too_many_required,
            param="pflash_required" if too_many_required else None,
        )
    return canon
