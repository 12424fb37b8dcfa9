"""Chat rendering, marker families and turn parsing (pflash/compress/render/chat.py, reference §5.3).

Prompts are rendered from the Jinja templates in tests/fixtures/templates (one per family,
written after each family's published format) with the real SmolLM2 tokenizer as the
target; only ChatML markers are special tokens of that tokenizer, so the other families'
markers are plain text in these prompts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pflash.compress.render.chat import (
    ChatInput,
    detect_family,
    parse_chat,
    render_chat,
    resolve_marker,
)
from pflash.compress.render.rerender import (
    SENTINEL_BEGIN,
    changed_char_span,
    locate_content_by_sentinel,
)
from pflash.compress.text.encoding import encode_as_written_with_offsets
from pflash.errors import InvalidRequest

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "templates"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
DIALOGUE = [
    {"role": "system", "content": "You are a careful analyst."},
    {"role": "user", "content": "Summarise the shipping report."},
    {"role": "assistant", "content": "Shipments rose in every region."},
    {"role": "user", "content": "Which region grew fastest?"},
]
AGENT = [
    {"role": "system", "content": "You are a careful analyst."},
    {"role": "user", "content": "What is the weather in Lyon today?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "Rain, 14 C"},
]


def template(name: str) -> str | None:
    return None if name == "smollm2" else (TEMPLATES / f"{name}.jinja").read_text()


def layout_of(tok, messages, name, *, thinking=None, tools=None, drafter=None):
    text = render_chat(
        tok, messages, tools=tools, enable_thinking=thinking, chat_template=template(name)
    )
    enc = encode_as_written_with_offsets(drafter or tok, text)
    return enc, parse_chat(enc, tok, chat_template=template(name))


def content_text(enc, turn) -> str:
    return enc.text[turn.char_content_begin : turn.char_content_end]


# ------------------------------------------------------------------ rendering


def test_qwen3_thinking_switch_and_tools_reach_the_template(smollm2_tokenizer):
    off = render_chat(
        smollm2_tokenizer,
        DIALOGUE,
        tools=TOOLS,
        enable_thinking=False,
        chat_template=template("qwen3"),
    )
    on = render_chat(
        smollm2_tokenizer,
        DIALOGUE,
        tools=TOOLS,
        enable_thinking=True,
        chat_template=template("qwen3"),
    )
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert on.endswith(
        "<|im_start|>user\nWhich region grew fastest?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert '"name": "get_weather"' in off.split("<|im_end|>")[0]


def test_content_parts_are_joined_and_none_content_is_empty(smollm2_tokenizer):
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}],
        },
        {"role": "assistant", "content": None},
    ]
    text = render_chat(smollm2_tokenizer, messages, add_generation_prompt=False)
    assert "<|im_start|>user\nfirst\nsecond<|im_end|>" in text
    assert "<|im_start|>assistant\n<|im_end|>" in text


@pytest.mark.parametrize(
    ("messages", "kwargs"),
    [
        ([{"role": "function", "content": "x"}], {}),
        ([{"content": "no role"}], {}),
        ([], {}),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], {}),
        ([{"role": "user", "content": "hi"}], {"template_kwargs": {"tokenize": True}}),
    ],
)
def test_bad_messages_are_invalid_requests(smollm2_tokenizer, messages, kwargs):
    with pytest.raises(InvalidRequest):
        render_chat(smollm2_tokenizer, messages, **kwargs)


def test_a_non_text_part_is_refused_as_the_api_refuses_it(smollm2_tokenizer):
    from pflash.serving.chat_completion.serving import parse_chat_request

    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    said = "content part 0 has type 'image_url': only text parts"
    with pytest.raises(InvalidRequest, match=f"messages\\[0\\].content: {said}") as chat:
        render_chat(smollm2_tokenizer, messages)
    with pytest.raises(InvalidRequest) as api:
        parse_chat_request({"model": "m", "messages": messages})
    assert (chat.value.message, chat.value.code) == (api.value.message, api.value.code)


def test_template_rejection_is_an_invalid_request(smollm2_tokenizer):
    twice_user = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(InvalidRequest, match="alternate"):
        render_chat(smollm2_tokenizer, twice_user, chat_template=template("gemma3"))


def test_responses_api_string_input_is_one_user_message():
    chat = ChatInput.build("What changed?")
    assert chat.messages == ({"role": "user", "content": "What changed?"},)
    assert chat.latest_user_index() == 0


# ------------------------------------------------------------------ marker resolution


def test_markers_resolve_through_the_target_vocabulary(smollm2_tokenizer, bpe_tokenizer):
    im_start = resolve_marker(smollm2_tokenizer, "<|im_start|>")
    assert im_start.special and im_start.text == "<|im_start|>"
    user = resolve_marker(smollm2_tokenizer, "<user>")
    assert not user.special and user.text == "<user>"
    assert not resolve_marker(bpe_tokenizer, "<start_of_turn>").special


FOREIGN_MARKERS = {
    "qwen": "<|im_start|>user",
    "deepseek": "<｜User｜>",
    "gemma": "<start_of_turn>model and <|turn>user",
    "laguna": "<user>x</user>",
}


@pytest.mark.parametrize("name", ["qwen3", "deepseek", "gemma3", "gemma4", "laguna"])
def test_family_of_the_rendering_template_wins_over_other_markers_in_user_words(
    smollm2_tokenizer, name
):
    family = FAMILY[name]
    pasted = (
        "Quote: "
        + " and ".join(m for f, m in FOREIGN_MARKERS.items() if f != family)
        + ". Which tag?"
    )
    enc, layout = layout_of(smollm2_tokenizer, [{"role": "user", "content": pasted}], name)
    assert layout.family == family
    assert content_text(enc, layout.query_turn) == pasted


def test_without_template_knowledge_special_markers_then_earliest_win(smollm2_tokenizer):
    text = "<user>\nhello\n</user>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    match = detect_family(text, smollm2_tokenizer, chat_template="")
    assert match.family.name == "qwen" and match.special
    laguna_only = "〈|EOS|〉<user>\nhello\n</user>\n<assistant>\n</think>"
    assert detect_family(laguna_only, smollm2_tokenizer, chat_template="").family.name == "laguna"
    assert detect_family("plain text, no markers", smollm2_tokenizer) is None


# ------------------------------------------------------------------ turns of each family

EXPECTED_DIALOGUE = {
    "qwen3": ["system", "user", "assistant", "user", "assistant"],
    "smollm2": ["system", "user", "assistant", "user", "assistant"],
    "deepseek": ["system", "user", "assistant", "user", "assistant"],
    "gemma3": ["user", "model", "user", "model"],
    "gemma4": ["system", "user", "model", "user", "model"],
    "laguna": ["system", "user", "assistant", "user", "assistant"],
}
FAMILY = {
    "qwen3": "qwen",
    "smollm2": "qwen",
    "deepseek": "deepseek",
    "gemma3": "gemma",
    "gemma4": "gemma",
    "laguna": "laguna",
}


@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("name", sorted(EXPECTED_DIALOGUE))
def test_dialogue_turns_roles_contents_and_generation_prompt(smollm2_tokenizer, name, thinking):
    enc, layout = layout_of(smollm2_tokenizer, DIALOGUE, name, thinking=thinking)
    assert layout.family == FAMILY[name]
    assert [t.role for t in layout.turns] == EXPECTED_DIALOGUE[name]
    assert [t.closed for t in layout.turns] == [True] * (len(layout.turns) - 1) + [False]
    gen = layout.turns[-1]
    assert layout.generation_turn_index == len(layout.turns) - 1
    assert layout.generation_begin == gen.role_begin and layout.has_generation_prompt
    query = layout.query_turn
    assert layout.query_turn_index == len(layout.turns) - 2 and query.role == "user"
    assert content_text(enc, query) == "Which region grew fastest?"
    assert not layout.later_turns
    earlier_user = layout.turns[-4]
    expected_first = "Summarise the shipping report."
    if name == "gemma3":  # Gemma 3 has no system role: the system prompt opens the first user turn
        expected_first = "You are a careful analyst.\n\n" + expected_first
    assert content_text(enc, earlier_user) == expected_first
    if name != "gemma3":
        assert content_text(enc, layout.turns[0]).endswith("You are a careful analyst.")


@pytest.mark.parametrize("name", sorted(EXPECTED_DIALOGUE))
def test_turn_indices_follow_the_character_to_token_rules(smollm2_tokenizer, bpe_tokenizer, name):
    for drafter in (smollm2_tokenizer, bpe_tokenizer):
        enc, layout = layout_of(smollm2_tokenizer, DIALOGUE, name, drafter=drafter)
        starts = [b for b, _ in enc.offsets]
        for t in layout.turns:
            b, e = enc.offsets[t.role_begin]
            assert b <= t.char_role_begin < e  # role_begin holds the marker's first character
            for index, char in (
                (t.content_begin, t.char_content_begin),
                (t.content_end, t.char_content_end),
            ):
                assert index == len(enc) or starts[index] >= char  # lower bound ...
                assert index == 0 or starts[index - 1] < char  # ... the first such token
            assert t.role_begin <= t.content_begin <= t.content_end <= t.turn_end <= len(enc)


@pytest.mark.parametrize(
    ("name", "roles", "generation", "later"),
    [
        ("qwen3", ["system", "user", "assistant", "tool", "assistant"], True, True),
        ("deepseek", ["system", "user", "assistant", "tool"], False, True),
        ("gemma4", ["system", "user", "model"], True, False),
        ("laguna", ["system", "user", "assistant", "tool", "assistant"], True, True),
    ],
)
def test_agent_loop_tool_output_turns(smollm2_tokenizer, name, roles, generation, later):
    enc, layout = layout_of(smollm2_tokenizer, AGENT, name, tools=TOOLS, thinking=False)
    assert [t.role for t in layout.turns] == roles
    assert layout.has_generation_prompt is generation
    assert layout.generation_begin == (layout.turns[-1].role_begin if generation else len(enc))
    assert layout.query_turn_index == 1
    assert layout.later_turns is later
    tool_turns = [t for t in layout.turns if t.role == "tool"]
    if name != "gemma4":  # Gemma 4 keeps the tool response inside the open model turn
        assert "Rain, 14 C" in content_text(enc, tool_turns[0])
    else:
        assert "Rain, 14 C" in content_text(enc, layout.turns[-1])


def test_user_turn_carrying_tool_result_counts_as_tool(smollm2_tokenizer):
    messages = [
        {"role": "user", "content": "Run it."},
        {"role": "assistant", "content": "Calling."},
        {"role": "user", "content": "<tool_result>exit 0</tool_result>"},
    ]
    enc, layout = layout_of(smollm2_tokenizer, messages, "smollm2")
    assert [t.role for t in layout.turns] == ["system", "user", "assistant", "tool", "assistant"]
    assert layout.query_turn_index == 1 and layout.later_turns


# ------------------------------------------------------------------ re-render location

LLAMA3 = (
    "{{- '<|begin_of_text|>' }}{%- for m in messages %}{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n'"
    " + m.content | trim + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)


@pytest.mark.parametrize("user", ["Which region grew fastest?", "  padded question?  "])
def test_sentinel_locates_the_latest_user_content_without_markers(smollm2_tokenizer, user):
    messages = DIALOGUE[:-1] + [{"role": "user", "content": user}]
    chat = ChatInput.build(messages, chat_template=LLAMA3)
    text = chat.render(smollm2_tokenizer)
    assert (
        parse_chat(
            encode_as_written_with_offsets(smollm2_tokenizer, text),
            smollm2_tokenizer,
            chat_template=LLAMA3,
        )
        is None
    )
    b, e = locate_content_by_sentinel(chat, chat.latest_user_index(), smollm2_tokenizer, text)
    assert text[b:e] == user.strip()
    assert text[:b].endswith("<|start_header_id|>user<|end_header_id|>\n\n")
    assert SENTINEL_BEGIN not in text


def test_changed_span_covers_a_removed_block_under_every_alignment():
    turn = "<|im_start|>system\nS<|im_end|>\n"
    rest = "<|im_start|>user\nU<|im_end|>\n"
    b, e = changed_char_span(turn + rest, rest)
    assert b == 0 and e >= len(turn)  # covers the whole system turn ...
    assert e <= len(turn) + len("<|im_start|>")  # ... plus at most the repeated marker
    assert changed_char_span("same", "same") is None
    b, e = changed_char_span("head DEFAULT tail", "head OTHER tail")
    assert "head DEFAULT tail"[b:e] == "DEFAULT"
