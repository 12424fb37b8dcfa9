"""Query derivation, history windows and pinned spans (pflash/compress/plan/query.py, reference §5.4-§5.6).

Prompts are real renders of the family templates in tests/fixtures/templates with the
SmolLM2 tokenizer as target (and drafter, unless a test says otherwise).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from pflash.compress.plan.query import find_query_window, map_last_occurrence, plan_prompt
from pflash.compress.render.chat import ChatInput, render_chat
from pflash.compress.render.rerender import locate_contents
from pflash.compress.text.encoding import encode_as_written_with_offsets
from pflash.config import build_config
from pflash.errors import CompressionFailed, InvalidRequest
from pflash.spans import MAX_INSTRUCTION_SPANS, Span

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "templates"
CONFIG = build_config(env={})
SYSTEM = "You are a careful analyst. Answer from the report only."
QUESTION = "Which district reported the most units in March?"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_district",
            "description": "Look up a district record by number",
            "parameters": {
                "type": "object",
                "properties": {"district": {"type": "integer"}},
                "required": ["district"],
            },
        },
    }
]
# (template, thinking switch) pairs: every family, thinking on and off where it has a switch.
RENDERS = [
    ("qwen3", True),
    ("qwen3", False),
    ("deepseek", True),
    ("deepseek", False),
    ("gemma3", None),
    ("gemma4", True),
    ("gemma4", False),
    ("laguna", True),
    ("laguna", False),
    ("smollm2", None),
]


def template(name: str) -> str | None:
    return None if name == "smollm2" else (TEMPLATES / f"{name}.jinja").read_text()


def report(n: int = 24, seed: int = 7) -> str:
    rng = random.Random(seed)
    months = ["January", "February", "March", "April"]
    lines = [
        f"District {i} reported {rng.randint(100, 999)} units in {rng.choice(months)}, "
        f"with {rng.choice(['steady', 'rising', 'falling'])} demand."
        for i in range(1, n + 1)
    ]
    return "\n".join(lines)


PLACEMENTS = {
    "first": f"{QUESTION}\n\n{report()}",
    "middle": f"{report(12, 1)}\n{QUESTION}\n{report(12, 2)}",
    "among_own_sentences": f"I attach the quarterly report. {QUESTION} Please be brief, I am in a hurry.\n\n{report()}",
    "twice": f"{QUESTION}\n\n{report()}\n\nAgain: {QUESTION}",
    "last": f"{report()}\n\n{QUESTION}",
}


def render(name, messages, *, thinking=None, tools=None):
    return render_chat(
        TOK["t"], messages, tools=tools, enable_thinking=thinking, chat_template=template(name)
    )


TOK = {}


@pytest.fixture(autouse=True)
def _tokenizer(smollm2_tokenizer):
    TOK["t"] = smollm2_tokenizer


def plan_chat(name, messages, *, thinking=None, tools=None, config=CONFIG, drafter=None, **kwargs):
    text = render(name, messages, thinking=thinking, tools=tools)
    kw = {"enable_thinking": thinking} if thinking is not None else None
    return plan_prompt(
        prompt_text=text,
        drafter_tokenizer=drafter or TOK["t"],
        target_tokenizer=TOK["t"],
        config=config,
        messages=messages,
        tools=tools,
        chat_template_kwargs=kw,
        chat_template=template(name),
        **kwargs,
    )


def plan_with_template(messages, chat_template: str):
    """A plan of `messages` rendered with a template given as text (no thinking switch)."""
    return plan_prompt(
        prompt_text=render_chat(TOK["t"], messages, chat_template=chat_template),
        drafter_tokenizer=TOK["t"],
        target_tokenizer=TOK["t"],
        config=CONFIG,
        messages=messages,
        chat_template=chat_template,
    )


def text_of(plan, span: Span) -> str:
    b, e = plan.drafter.char_span(span)
    return plan.drafter.text[b:e]


def chars_of(plan, spans) -> set[int]:
    out = set()
    for s in spans:
        b, e = plan.drafter.char_span(s)
        out.update(range(b, e))
    return out


def covers(plan, spans, begin: int, end: int) -> bool:
    return set(range(begin, end)) <= chars_of(plan, spans)


def conversation(user_text: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user_text}]


# ------------------------------------------------------------------ prompt_end (chat default)


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
@pytest.mark.parametrize(("name", "thinking"), RENDERS)
def test_prompt_end_queries_the_last_token_and_pins_the_generation_prompt(
    name, thinking, placement
):
    user = PLACEMENTS[placement]
    plan = plan_chat(name, conversation(user), thinking=thinking)
    n = plan.n_tokens
    layout = plan.layout
    assert plan.query_rule == "prompt_end"
    assert plan.query_span == plan.query == Span(n - 1, n)
    gen = Span(layout.generation_begin, n)
    assert 0 < gen.begin < n
    query_turn = layout.query_turn
    # the whole generation prompt and the user role header are kept verbatim (§10.4 item 38)
    assert covers(plan, plan.required, *plan.drafter.char_span(gen))
    assert covers(plan, plan.required, *plan.drafter.char_span(query_turn.header))
    assert text_of(plan, query_turn.header).rstrip().endswith(("user", "<｜User｜>", "<user>"))
    # the turn window is the tail of the user content, wherever the question sits
    assert plan.turn_query == Span(
        max(query_turn.content_begin, query_turn.content_end - 8), query_turn.content_end
    )
    assert user.strip()[-6:] in text_of(plan, plan.turn_query)
    assert [w.kind for w in plan.windows()] == ["main", "turn"]
    assert not plan.query_suffix_candidates
    # the system prompt is pinned as system, whatever the template did with it
    assert len(plan.system) == 1 and SYSTEM in text_of(plan, plan.system[0])


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
@pytest.mark.parametrize(("name", "thinking"), RENDERS)
def test_explicit_query_maps_to_its_last_occurrence(name, thinking, placement):
    plan = plan_chat(
        name, conversation(PLACEMENTS[placement]), thinking=thinking, pflash_query=QUESTION
    )
    last = plan.drafter.text.rfind(QUESTION)
    assert plan.query_rule == "explicit_query_span"
    b, e = plan.drafter.char_span(plan.query_span)
    assert b <= last and last + len(QUESTION) <= e  # covers the whole last occurrence ...
    assert e - b < len(QUESTION) + 8  # ... and little else
    assert plan.query == Span(
        max(plan.query_span.begin, plan.query_span.end - 8), plan.query_span.end
    )
    assert covers(plan, plan.required, last, last + len(QUESTION))
    if placement == "twice":
        assert plan.drafter.text.find(QUESTION) < b


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
@pytest.mark.parametrize(
    ("name", "thinking"), [("qwen3", False), ("deepseek", True), ("laguna", False)]
)
def test_required_strings_map_to_their_last_occurrence_in_the_user_content(
    name, thinking, placement
):
    needle = "District 7 reported"
    plan = plan_chat(
        name,
        conversation(PLACEMENTS[placement]),
        thinking=thinking,
        pflash_required=[QUESTION, needle],
    )
    text = plan.drafter.text
    assert covers(plan, plan.required, text.rfind(QUESTION), text.rfind(QUESTION) + len(QUESTION))
    assert covers(plan, plan.required, text.rfind(needle), text.rfind(needle) + len(needle))


# ------------------------------------------------------------------ history queries


HISTORY_CHAT = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "First question about district 3?"},
    {"role": "assistant", "content": "District 3 reported 400 units."},
    {"role": "user", "content": "Second question about district 5?"},
    {"role": "assistant", "content": "District 5 reported 410 units."},
    {"role": "user", "content": f"{report()}\n\n{QUESTION}"},
]


@pytest.mark.parametrize(("name", "thinking"), RENDERS)
def test_prompt_end_history_windows_are_reply_header_last_tokens(name, thinking):
    plan = plan_chat(name, HISTORY_CHAT, thinking=thinking)
    turns = plan.layout.turns
    users = [k for k, t in enumerate(turns) if t.role == "user"][:-1]
    replies = [turns[k + 1] for k in reversed(users)]  # most recent first
    assert plan.history == tuple(Span(r.content_begin - 1, r.content_begin) for r in replies)
    for window, reply in zip(plan.history, replies, strict=True):
        assert window.begin >= reply.role_begin  # inside the reply's header
    assert [(w.kind, w.weight) for w in plan.windows()] == [
        ("main", 1.0),
        ("turn", 1.0),
        ("history", 0.5),
        ("history", 0.25),
    ]


def test_history_limit_and_tail_windows_outside_prompt_end():
    limited = plan_chat(
        "qwen3",
        HISTORY_CHAT,
        thinking=False,
        config=build_config({"chat_history_queries": 1}, env={}),
    )
    assert len(limited.history) == 1
    none = plan_chat(
        "qwen3",
        HISTORY_CHAT,
        thinking=False,
        config=build_config({"chat_history_queries": 0}, env={}),
    )
    assert none.history == ()
    explicit = plan_chat("qwen3", HISTORY_CHAT, thinking=False, pflash_query=QUESTION)
    assert len(explicit.history) == 2
    for h, expected in zip(explicit.history, ["district 5?", "district 3?"], strict=True):
        assert len(h) <= 8 and text_of(explicit, h).endswith(expected)


# ------------------------------------------------------------------ agent loop


def agent_chat(question_first: bool = True) -> list[dict]:
    user = f"{QUESTION}\n\n{report(8)}" if question_first else f"{report(8)}\n\n{QUESTION}"
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": user},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "lookup_district", "arguments": '{"district": 7}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "name": "lookup_district", "content": report(30, 9)},
    ]


@pytest.mark.parametrize("name", ["qwen3", "laguna"])
def test_agent_loop_with_query_in_the_user_turn_scores_the_suffix(name):
    plan = plan_chat(name, agent_chat(), thinking=False, tools=TOOLS, pflash_query=QUESTION)
    layout = plan.layout
    n = plan.n_tokens
    assert layout.later_turns and plan.query_suffix_candidates
    query_turn = layout.query_turn
    assert (
        query_turn.content_begin
        <= plan.query_span.begin
        < plan.query_span.end
        <= query_turn.content_end
    )
    rest_of_turn = Span(plan.query_span.end, query_turn.turn_end)
    for span in (rest_of_turn, Span(layout.generation_begin, n)):
        assert covers(plan, plan.required, *plan.drafter.char_span(span))
    tool_turn = next(t for t in layout.turns if t.role == "tool")
    # the long tool output is a scored candidate, not pinned: only its header is
    assert not covers(plan, plan.pinned(), tool_turn.char_content_begin, tool_turn.char_content_end)
    assert covers(plan, plan.instruction_role, *plan.drafter.char_span(tool_turn.header))


def test_deepseek_agent_loop_without_generation_prompt_tails_the_user_turn():
    plan = plan_chat("deepseek", agent_chat(question_first=False), thinking=False, tools=TOOLS)
    layout = plan.layout
    assert not layout.has_generation_prompt and plan.generation_begin == plan.n_tokens
    assert plan.query_rule == "chat_user_tail"
    assert plan.query_span == Span(layout.query_turn.content_end - 8, layout.query_turn.content_end)
    assert plan.query_suffix_candidates
    assert QUESTION[-10:] in text_of(plan, plan.query)


def test_prompt_end_agent_loop_keeps_the_query_at_the_end():
    plan = plan_chat("qwen3", agent_chat(), thinking=True, tools=TOOLS)
    assert plan.query_rule == "prompt_end" and not plan.query_suffix_candidates
    assert plan.query.end == plan.n_tokens


# ------------------------------------------------------------------ pins: system, developer, tools, skeleton


@pytest.mark.parametrize(("name", "thinking"), [r for r in RENDERS if r[0] != "gemma3"])
def test_tool_definitions_are_always_kept_like_the_system_prompt(name, thinking):
    """An agent's tools are instructions: kept whatever the context (the system group), not
    dropped to fit it as the dialogue skeleton may be."""
    plan = plan_chat(name, agent_chat(), thinking=thinking, tools=TOOLS)
    text = plan.drafter.text
    description = "Look up a district record by number"
    if name == "smollm2":  # SmolLM2's own template does not render tools
        assert description not in text
        return
    pos = text.find(description)
    assert covers(plan, plan.system, pos, pos + len(description))
    pos = text.find(SYSTEM)
    assert covers(plan, plan.system, pos, pos + len(SYSTEM))
    assert not covers(plan, plan.instruction_role, pos, pos + len(description))


def test_developer_messages_are_always_kept_and_replaced_system_text_is_whole():
    messages = [
        {
            "role": "system",
            "content": "You are terse.",
        },  # SmolLM2 substitutes a default system prompt
        {"role": "developer", "content": "Always cite the district number."},
        {"role": "user", "content": f"{report()}\n\n{QUESTION}"},
    ]
    plan = plan_chat("smollm2", messages)
    assert text_of(plan, plan.system[0]).startswith("You are terse.<|im_end|>")
    developer = plan.drafter.text.find("Always cite the district number.")
    assert covers(plan, plan.system, developer, developer + len("Always cite the district number."))


def test_a_system_prompt_equal_to_the_template_default_is_still_pinned():
    # Removing it renders the same text (SmolLM2 inserts this default), so the removal diff
    # finds nothing; the wrapped rendering still locates its content.
    default = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    messages = [{"role": "system", "content": default}, {"role": "user", "content": report()}]
    plan = plan_chat("smollm2", messages)
    pos = plan.drafter.text.find(default)
    assert covers(plan, plan.system, pos, pos + len(default))


@pytest.mark.parametrize("name", ["smollm2", "qwen3", "laguna"])
def test_pinned_spans_render_the_chat_a_fixed_number_of_times_whatever_the_messages(
    name, monkeypatch
):
    calls = []
    real = ChatInput.render

    def counted(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ChatInput, "render", counted)
    for turns in (2, 12):
        messages = [{"role": "system", "content": SYSTEM}]
        for k in range(turns):
            messages += [
                {"role": "user", "content": f"Part {k}: {report(4, k)}"},
                {"role": "assistant", "content": f"Noted part {k}."},
                {"role": "system", "content": f"Rule {k}: answer in words."},
            ]
        messages.append({"role": "user", "content": QUESTION})
        calls.clear()
        plan = plan_chat(name, messages)
        text = plan.drafter.text
        pos = text.find(SYSTEM)
        assert covers(plan, plan.system, pos, pos + len(SYSTEM))
        for k in range(turns):
            rule = f"Rule {k}: answer in words."
            pos = text.find(rule)
            assert pos >= 0 and covers(plan, plan.system, pos, pos + len(rule))
        assert len(calls) <= 3, (turns, len(calls))


TERSE = {"role": "system", "content": "You are terse."}
GREETING = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
INSTRUCTION_CHATS = {
    "system_first": [TERSE],
    "system_and_developer": [TERSE, {"role": "developer", "content": "Always cite."}],
    "two_systems": [TERSE, *GREETING, {"role": "system", "content": "Now be verbose."}],
    "late_developer": [*GREETING, {"role": "developer", "content": "Cite sources."}],
    "late_system": [*GREETING, {"role": "system", "content": "Cite sources."}],
}


@pytest.mark.parametrize("shape", sorted(INSTRUCTION_CHATS))
@pytest.mark.parametrize(("name", "thinking"), RENDERS)
def test_the_wrapped_rendering_pins_what_per_message_renderings_pin(
    name, thinking, shape, monkeypatch
):
    messages = [*INSTRUCTION_CHATS[shape], {"role": "user", "content": f"{report()}\n{QUESTION}"}]
    if name == "gemma3":  # Gemma 3 takes one leading system prompt and alternating turns
        messages = [m for m in messages[:1] if m["role"] == "system"] + messages[-1:]
    tools = TOOLS if shape == "system_first" else None
    wrapped = plan_chat(name, messages, thinking=thinking, tools=tools)
    monkeypatch.setattr("pflash.compress.render.rerender.Rerender.contents", lambda self, idx: None)
    per_message = plan_chat(name, messages, thinking=thinking, tools=tools)
    assert wrapped.content == per_message.content
    assert wrapped.instruction_role == per_message.instruction_role
    if name == "deepseek" and shape == "late_system":
        # DeepSeek moves every system prompt to the start of the prompt: the per-message
        # diff cuts into the next marker, the wrapped rendering pins the parsed turn.
        assert chars_of(per_message, per_message.system) <= chars_of(wrapped, wrapped.system)
    else:
        assert wrapped.system == per_message.system


def test_a_template_that_edits_content_falls_back_to_per_message_renders():
    # The template trims each content, so the wrapped rendering does not validate (the
    # sentinels hide the whitespace from the trim); each message is found by removal.
    trimming = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
        "{% endif %}"
    )
    messages = [
        {"role": "user", "content": "Read this first."},
        {"role": "system", "content": "  You are terse.  "},
        {"role": "user", "content": f"{report()}\n\n{QUESTION}\n"},
    ]
    text = render_chat(TOK["t"], messages, chat_template=trimming)
    chat = ChatInput.build(messages, chat_template=trimming)
    assert locate_contents(chat, [1, 2], TOK["t"], text) is None
    plan = plan_with_template(messages, trimming)
    pos = text.find("You are terse.")
    assert covers(plan, plan.system, pos, pos + len("You are terse."))


def test_skeleton_keeps_short_turns_whole_and_long_turns_by_header():
    long_answer = report(40, 3)
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Short earlier question?"},
        {"role": "assistant", "content": long_answer},
        {"role": "user", "content": f"{report()}\n\n{QUESTION}"},
    ]
    plan = plan_chat("qwen3", messages, thinking=False)
    short_user, long_reply = plan.layout.turns[1], plan.layout.turns[2]
    assert covers(plan, plan.instruction_role, short_user.char_role_begin, short_user.char_turn_end)
    assert covers(plan, plan.instruction_role, *plan.drafter.char_span(long_reply.header))
    assert not covers(
        plan, plan.pinned(), long_reply.char_content_begin, long_reply.char_content_end
    )
    headers_only = plan_chat(
        "qwen3", messages, thinking=False, config=build_config({"chat_skeleton_tokens": 0}, env={})
    )
    assert not covers(
        headers_only,
        headers_only.pinned(),
        short_user.char_content_begin,
        short_user.char_content_end,
    )
    assert covers(
        headers_only, headers_only.instruction_role, *plan.drafter.char_span(short_user.header)
    )


@pytest.mark.parametrize("system", [None, "You are terse."])
def test_the_system_turn_keeps_its_header_and_the_template_default_is_pinned_whole(system):
    """Without the attention sink (passage evidence) nothing else keeps a prompt's first
    tokens: a served prompt must not open with a system message's text but no header."""
    messages = [{"role": "user", "content": f"{report()}\n\n{QUESTION}"}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    plan = plan_chat("smollm2", messages)
    turn = plan.layout.turns[0]
    assert turn.role == "system"
    assert covers(plan, plan.pinned(), *plan.drafter.char_span(turn.header))
    if system is None:  # SmolLM2's default system prompt: the template's text, pinned whole
        assert covers(plan, plan.instruction_role, turn.char_role_begin, turn.char_turn_end)
    else:  # a client's message: pinned by its own span, its header by the skeleton
        assert [text_of(plan, s) for s in plan.system] == [system]


def test_long_conversations_keep_the_newest_skeleton_within_the_span_limit():
    messages = [{"role": "system", "content": SYSTEM}]
    for i in range(45):
        messages += [
            {"role": "user", "content": f"Question {i}?"},
            {"role": "assistant", "content": f"Answer {i}."},
        ]
    messages.append({"role": "user", "content": f"{report()}\n\n{QUESTION}"})
    plan = plan_chat("laguna", messages, thinking=False)
    assert len(plan.instruction_role) <= MAX_INSTRUCTION_SPANS
    newest = plan.layout.turns[-3]  # the last assistant answer before the question
    oldest = plan.layout.turns[1]
    assert covers(plan, plan.instruction_role, newest.char_role_begin, newest.char_turn_end)
    assert not covers(plan, plan.pinned(), oldest.char_content_begin, oldest.char_content_end)


# ------------------------------------------------------------------ other parsers and inputs


def test_raw_text_uses_a_prompt_tail_window():
    text = f"{report()}\n\n{QUESTION}"
    plan = plan_prompt(
        prompt_text=text, drafter_tokenizer=TOK["t"], target_tokenizer=TOK["t"], config=CONFIG
    )
    n = plan.n_tokens
    assert (
        plan.query_rule == "prompt_tail" and plan.layout is None and plan.generation_begin is None
    )
    assert plan.query_span == plan.query == Span(n - 8, n)
    assert plan.required == (Span(n - 8, n),) and plan.system == () and plan.instruction_role == ()
    assert plan.input_kind == "raw_text"


def test_raw_completion_of_a_chat_prompt_uses_prompt_end():
    text = render("qwen3", conversation(PLACEMENTS["last"]), thinking=False)
    plan = plan_prompt(
        prompt_text=text, drafter_tokenizer=TOK["t"], target_tokenizer=TOK["t"], config=CONFIG
    )
    assert plan.query_rule == "prompt_end" and plan.layout.family == "qwen"


def test_marker_text_inside_raw_text_without_a_generation_prompt_is_plain_text():
    text = f"Notes use <user> and </user> tags.\n{report(4)}"
    plan = plan_prompt(
        prompt_text=text, drafter_tokenizer=TOK["t"], target_tokenizer=TOK["t"], config=CONFIG
    )
    assert plan.layout is None and plan.query_rule == "prompt_tail"


LLAMA3 = (
    "{{- '<|begin_of_text|>' }}{%- for m in messages %}{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n'"
    " + m.content | trim + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)


def test_marker_less_chat_tails_the_sentinel_located_user_content():
    messages = conversation(PLACEMENTS["last"])
    text = render_chat(TOK["t"], messages, chat_template=LLAMA3)
    plan = plan_with_template(messages, LLAMA3)
    assert plan.layout is None and plan.query_rule == "content_tail"
    b, e = plan.drafter.char_span(plan.content)
    located = text[b:e]  # token edges may round out by a character ("?<" is one token)
    assert located.startswith(PLACEMENTS["last"]) and len(located) - len(PLACEMENTS["last"]) <= 2
    assert plan.query.end == plan.content.end and "units in March?" in text_of(plan, plan.query)
    assert covers(plan, plan.system, text.find(SYSTEM), text.find(SYSTEM) + len(SYSTEM))


@pytest.mark.parametrize(
    ("name", "thinking", "rule"),
    [
        ("qwen3", False, "semantic_suffix"),
        ("laguna", True, "semantic_suffix"),
        # "?<end_of_turn>" encodes "?<" as one token, so the anchored match fails at the last
        # token; the sentinel-located content's tail is the query then
        ("gemma3", None, "content_tail"),
    ],
)
def test_latest_user_parser_anchors_the_user_text_at_its_sentinel_located_end(name, thinking, rule):
    config = build_config({"select_query_parser": "latest_user"}, env={})
    plan = plan_chat(name, conversation(PLACEMENTS["last"]), thinking=thinking, config=config)
    assert plan.query_parser == "latest_user" and plan.query_rule == rule
    assert plan.query_span.end == plan.content.end and len(plan.query_span) <= 8
    assert len(plan.query_span) >= 4 and "units in March?" in text_of(plan, plan.query_span)


def test_latest_user_parser_searches_an_explicit_query_only_in_the_user_content():
    config = build_config({"select_query_parser": "latest_user"}, env={})
    messages = [
        {"role": "system", "content": f"Context: {QUESTION}"},
        {"role": "user", "content": report()},
    ]
    with pytest.raises(CompressionFailed) as err:
        plan_chat("qwen3", messages, thinking=False, config=config, pflash_query=QUESTION)
    assert err.value.stage == "query_mapping"
    anywhere = plan_chat("qwen3", messages, thinking=False, pflash_query=QUESTION)
    assert anywhere.query_rule == "explicit_query_span"


def test_responses_api_string_input_counts_as_the_user_query():
    text = render_chat(TOK["t"], [{"role": "user", "content": PLACEMENTS["last"]}])
    plan = plan_prompt(
        prompt_text=text,
        drafter_tokenizer=TOK["t"],
        target_tokenizer=TOK["t"],
        config=build_config({"select_query_parser": "latest_user"}, env={}),
        messages=PLACEMENTS["last"],
    )
    assert plan.input_kind == "messages" and plan.query_rule == "semantic_suffix"
    assert text_of(plan, plan.query_span).endswith("in March?")


def test_legacy_selector_with_markers_tails_the_user_turn():
    plan = plan_chat(
        "qwen3",
        conversation(PLACEMENTS["middle"]),
        thinking=False,
        config=build_config({"select_mode": "legacy"}, env={}),
    )
    assert plan.query_rule == "chat_user_tail"
    assert plan.query_span.end == plan.layout.query_turn.content_end


# ------------------------------------------------------------------ fail closed (§10.4 item 37)


def test_unknown_explicit_query_fails_closed_as_a_client_error():
    with pytest.raises(CompressionFailed) as err:
        plan_chat(
            "qwen3", conversation(report()), thinking=False, pflash_query="Which river floods?"
        )
    assert (
        err.value.stage == "query_mapping"
        and err.value.http_status == 400
        and err.value.param == "pflash_query"
    )


def test_explicit_query_after_the_user_turn_is_not_mapped():
    with pytest.raises(CompressionFailed, match="query_mapping"):
        plan_chat(
            "qwen3", agent_chat(), thinking=False, tools=TOOLS, pflash_query="District 30 reported"
        )


def test_unknown_required_string_fails_closed_as_a_client_error():
    with pytest.raises(CompressionFailed) as err:
        plan_chat(
            "laguna",
            conversation(report()),
            thinking=False,
            pflash_required=["District 99 reported"],
        )
    assert err.value.stage == "required_mapping" and err.value.http_status == 400


def test_required_strings_are_searched_only_in_the_latest_user_content():
    with pytest.raises(CompressionFailed, match="required_mapping"):
        plan_chat(
            "qwen3", conversation(report()), thinking=False, pflash_required=["careful analyst"]
        )


def test_required_strings_need_strict_selection():
    with pytest.raises(InvalidRequest):
        plan_chat(
            "qwen3",
            conversation(report()),
            thinking=False,
            config=build_config({"select_mode": "legacy"}, env={}),
            pflash_required=["District 3"],
        )
    with pytest.raises(InvalidRequest):
        plan_chat("qwen3", conversation(report()), thinking=False, pflash_required="District 3")


def test_more_than_64_required_spans_fail_span_validation():
    words = [f"w{i}x" for i in range(MAX_INSTRUCTION_SPANS + 16)]  # + question pin merges
    user = " filler text between ".join(words)
    with pytest.raises(CompressionFailed) as err:
        plan_chat("qwen3", conversation(user), thinking=False, pflash_required=words)
    assert err.value.stage == "span_validation" and err.value.http_status == 400


def test_prompt_text_that_is_not_the_rendered_messages_fails_span_validation():
    messages = conversation(report())
    text = render("qwen3", messages, thinking=True)
    with pytest.raises(CompressionFailed) as err:
        plan_prompt(
            prompt_text=text,
            drafter_tokenizer=TOK["t"],
            target_tokenizer=TOK["t"],
            config=CONFIG,
            messages=messages,
            chat_template=template("qwen3"),
            chat_template_kwargs={"enable_thinking": False},
        )
    assert err.value.stage == "span_validation"


def test_empty_prompt_fails():
    with pytest.raises(CompressionFailed, match="query_mapping"):
        plan_prompt(
            prompt_text="", drafter_tokenizer=TOK["t"], target_tokenizer=TOK["t"], config=CONFIG
        )


# ------------------------------------------------------------------ find_query_window (§10.2 item 24)

# Token ids stand for words; 900/901 are a chat suffix after the user content.
QUERY = [11, 12, 13, 14, 15, 16, 17, 18]


def test_user_query_before_the_chat_suffix_maps_to_its_end():
    prompt = [1, 2] + QUERY + [900, 901]
    assert find_query_window(prompt, QUERY, 8, search_end=10, anchored=True) == Span(2, 10)


def test_one_bpe_boundary_token_narrows_the_window_to_seven():
    prompt = [1, 2, 99] + QUERY[1:] + [900, 901]  # first query token merged differently
    assert find_query_window(prompt, QUERY, 8, search_end=10, anchored=True) == Span(3, 10)


def test_a_three_token_match_of_an_eight_token_query_is_rejected():
    prompt = [1, 2, 3, 4, 5, 6, 7] + QUERY[-3:] + [900, 901]
    assert find_query_window(prompt, QUERY, 8, search_end=10, anchored=True) is None
    assert find_query_window(prompt, QUERY, 8, search_end=10, anchored=False) is None


def test_a_three_token_query_matches_with_three_tokens():
    prompt = [1, 2, 3, 21, 22, 23, 900]
    assert find_query_window(prompt, [21, 22, 23], 8, search_end=6, anchored=True) == Span(3, 6)


def test_a_generic_suffix_in_an_earlier_turn_is_rejected_but_accepted_at_the_boundary():
    generic = [40, 41, 42, 43]
    earlier = [1] + generic + [900, 901, 2, 3, 4, 5]
    s = len(earlier) + 2
    assert (
        find_query_window(earlier + [900, 901], generic, 8, search_end=s - 2, anchored=True) is None
    )
    at_boundary = [1, 2, 3] + generic + [900, 901]
    s = len(at_boundary)
    assert find_query_window(at_boundary, generic, 8, search_end=s - 2, anchored=True) == Span(
        s - 6, s - 2
    )


def test_unanchored_takes_the_latest_occurrence_and_trims_a_merged_last_token():
    prompt = (
        [1] + QUERY + [2] + QUERY[:-1] + [77] + [3]
    )  # the later copy's last token merged with a marker
    span = find_query_window(prompt, QUERY, 8, search_end=len(prompt), anchored=False)
    assert span == Span(1, 9)  # the untrimmed full match wins over the trimmed later one
    prompt = [1] + QUERY[:-1] + [77, 3]
    assert find_query_window(prompt, QUERY, 8, search_end=len(prompt), anchored=False) == Span(1, 8)


def test_map_last_occurrence_covers_the_needle(smollm2_tokenizer):
    enc = encode_as_written_with_offsets(smollm2_tokenizer, "alpha beta gamma beta delta")
    span = map_last_occurrence(enc, "beta")
    assert (
        enc.text.__getitem__(slice(*enc.char_span(span))) == " beta"
    )  # the last one, token " beta"
    assert enc.char_span(span) == (16, 21)
    assert map_last_occurrence(enc, "omega") is None


# ------------------------------------------------------------------ end to end, one and two vocabularies


def test_end_to_end_plan_with_smollm2_as_drafter_and_target():
    plan = plan_chat("smollm2", [*agent_chat()[:2]], pflash_required=["District 7 reported"])
    text = plan.drafter.text
    assert (
        plan.query_rule == "prompt_end"
        and plan.layout.family == "qwen"
        and plan.layout.special_markers
    )
    assert [w.kind for w in plan.windows()] == ["main", "turn"]
    assert text_of(plan, plan.query) == "\n"
    assert text_of(plan, plan.turn_query).endswith("demand.")
    assert [text_of(plan, s) for s in plan.system] == [SYSTEM]
    assert text_of(plan, Span(plan.generation_begin, plan.n_tokens)) == "<|im_start|>assistant\n"
    pos = text.rfind("District 7 reported")
    assert covers(plan, plan.required, pos, pos + len("District 7 reported"))


@pytest.mark.parametrize("name", ["qwen3", "deepseek", "laguna"])
def test_cross_vocabulary_plans_cover_the_same_text(bpe_tokenizer, name):
    kwargs = {"thinking": False, "tools": TOOLS, "pflash_required": ["District 7 reported"]}
    same = plan_chat(name, HISTORY_CHAT, **kwargs)
    cross = plan_chat(name, HISTORY_CHAT, drafter=bpe_tokenizer, **kwargs)
    assert cross.drafter.text == same.drafter.text and cross.n_tokens > same.n_tokens * 1.3
    assert cross.query_rule == same.query_rule == "prompt_end"
    assert [t.role for t in cross.layout.turns] == [t.role for t in same.layout.turns]
    for a, b in zip(cross.layout.turns, same.layout.turns, strict=True):
        assert (a.char_content_begin, a.char_content_end) == (
            b.char_content_begin,
            b.char_content_end,
        )
    for name_ in ("required", "system", "instruction_role"):
        mine, theirs = getattr(cross, name_), getattr(same, name_)
        assert len(mine) == len(theirs), name_
        # each vocabulary rounds a span out to its own token edges, so the covered text may
        # differ by a character or two at a span's ends, never more
        assert len(chars_of(cross, mine) ^ chars_of(same, theirs)) <= 4 * len(mine), name_
    for plan in (cross, same):
        replies = [
            t
            for k, t in enumerate(plan.layout.turns)
            if k and plan.layout.turns[k - 1].role == "user"
        ]
        for window, reply in zip(plan.history, reversed(replies[:-1]), strict=True):
            b, e = plan.drafter.char_span(window)  # the header's last token, in either vocabulary
            assert b < reply.char_content_begin <= e
        assert "in March?" in text_of(plan, plan.turn_query)


# --------------------------------------------------------------------------- question pin


def _plan_for(tokenizer, user: str, **cfg):
    from pflash.compress.plan.query import plan_prompt
    from pflash.compress.render.chat import render_chat
    from pflash.config import build_config

    messages = [{"role": "user", "content": user}]
    text = render_chat(tokenizer, messages)
    config = build_config(cfg, env={})
    plan = plan_prompt(
        prompt_text=text,
        drafter_tokenizer=tokenizer,
        target_tokenizer=tokenizer,
        config=config,
        messages=messages,
    )
    return plan


def _pinned_texts(plan):
    return [_span_text(plan, s) for s in plan.required]


def _span_text(plan, span):
    from pflash.models.source import load_tokenizer
    from pflash.spans import decode_ids

    tok = load_tokenizer("embedded:smollm2-135m")
    return decode_ids(tok, plan.drafter.ids[span.begin : span.end])


def test_question_line_closing_the_user_turn_is_pinned_whole(smollm2_tokenizer):
    doc = "Some long document text. " * 40
    question = "What is the special magic quokka number mentioned in the document above?"
    plan = _plan_for(smollm2_tokenizer, doc + "\n\n" + question)
    assert any(t.strip() == question for t in _pinned_texts(plan))


@pytest.mark.parametrize(
    "sentence",
    ["Filler sentence number one is here. ", 'The guard said "stop here." '],
    ids=["plain", "quoted-end"],
)
def test_long_final_line_pins_its_last_whole_sentences_within_the_cap(smollm2_tokenizer, sentence):
    question = "Which colour was the car?"
    plan = _plan_for(smollm2_tokenizer, sentence * 30 + question, chat_question_pin_tokens=16)
    (span,) = [s for s in plan.required if "colour" in _span_text(plan, s)]
    text = _span_text(plan, span).strip()
    assert len(span) <= 16
    assert text in [sentence * k + question for k in range(3)]


def test_question_pin_can_be_turned_off_for_reference_parity(smollm2_tokenizer):
    question = "What is the special magic quokka number mentioned in the document above?"
    plan = _plan_for(smollm2_tokenizer, "Text. " * 40 + "\n" + question, chat_question_pin_tokens=0)
    assert not any(question in t for t in _pinned_texts(plan))
