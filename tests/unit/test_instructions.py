"""Instructions are kept verbatim, evidence is what PFlash compresses.

Instructions: system and developer text outside its documents, the instruction blocks agent
clients write into user and tool turns, every tool definition. Evidence: tool results,
files, command output, pasted and retrieved documents (a document inside a system message
too). Planned on the agent clients' recorded requests (tests/fixtures/agent_clients) and on
small chats, with the real SmolLM2 tokenizer and template.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from pflash.compress.pipeline import CompressionRequest, prepare
from pflash.compress.text.instruction_blocks import instruction_blocks
from pflash.config import build_config
from pflash.flow.request import render_request
from pflash.serving.admission import request_params
from pflash.serving.messages.translate import EDGE as MESSAGES
from pflash.serving.responses.translate import EDGE as RESPONSES
from pflash.spans import Span
from pflash_lab.bench.instruction_lines import instruction_lines, tool_schemas

FIXTURES = Path(__file__).parents[1] / "fixtures" / "agent_clients"
CLAUDE = json.loads((FIXTURES / "claude_code.json").read_text())["requests"]
CODEX = json.loads((FIXTURES / "codex.json").read_text())["requests"]
TAGS = build_config({}, env={}).instruction_tags
FILE = "\n".join(
    f"line {i}: the quick brown fox jumps over the lazy dog {i * 7}" for i in range(400)
)


def _prepared(tokenizer, edge, body, **overrides):
    """`prepare` of an edge request as the ingress runs it (render, cap, plan, budget)."""
    config = build_config({"semantic_embedder_dtype": "float32", **overrides}, env={})
    chat = edge.parse(json.dumps(body)).chat
    prompt = render_request(chat, "chat", tokenizer)
    params = request_params(chat, config)
    inp = CompressionRequest(prompt, max_output=params.max_tokens or 0, max_context=1 << 20)
    return prepare(inp, config=config, target_tokenizer=tokenizer, drafter_tokenizer=tokenizer)


def _pinned_text(prepared) -> str:
    plan = prepared.plan
    return "\n".join(plan.drafter.text[slice(*plan.drafter.char_span(s))] for s in plan.pinned())


def _uncovered(prepared, pieces) -> list[str]:
    """The pieces that are not inside one pinned span of the plan."""
    pinned = _pinned_text(prepared)
    return [p for p in pieces if p not in pinned]


# ----------------------------------------------------------------------------- blocks


def test_instruction_blocks_are_found_whole_with_their_tags():
    text = (
        "<system-reminder>\nGit status: clean\n</system-reminder>\n"
        "What does <b>calc</b> do?\n"
        '<environment_context cwd="/w">\n  <shell>bash</shell>\n</environment_context>'
    )
    blocks = instruction_blocks(text, TAGS)
    assert [text[b:e] for b, e in blocks] == [
        "<system-reminder>\nGit status: clean\n</system-reminder>",
        '<environment_context cwd="/w">\n  <shell>bash</shell>\n</environment_context>',
    ]
    assert instruction_blocks("<system-reminder> never closed", TAGS) == []
    assert instruction_blocks("<SYSTEM-REMINDER>x</SYSTEM-REMINDER>", TAGS) == []


def test_instruction_blocks_stay_linear_on_opening_tags_without_a_close():
    """Client text: 200K opening tags and one close at the end cost one pass, not 200K
    scans to the end."""
    text = "<system-reminder>" * 200_000 + "x</system-reminder>"
    started = time.perf_counter()
    blocks = instruction_blocks(text, TAGS)
    assert time.perf_counter() - started < 2.0
    assert blocks == [(0, len(text))]


# ----------------------------------------------------------------------------- the clients


@pytest.mark.parametrize(("edge", "recorded"), [(MESSAGES, CLAUDE[0]), (RESPONSES, CODEX[0])])
def test_a_first_request_of_only_instructions_is_served_whole_without_the_drafter(
    smollm2_tokenizer, edge, recorded
):
    """A new session's first request is the harness and a question: every line of it and
    every tool schema is pinned, so nothing is droppable and the drafter never runs."""
    body = recorded["body"]
    prepared = _prepared(smollm2_tokenizer, edge, body)
    assert _uncovered(prepared, instruction_lines(body)) == []
    assert _uncovered(prepared, tool_schemas(body)) == []
    assert not prepared.compress and prepared.score_request is None
    assert prepared.budget.droppable < 64


@pytest.mark.parametrize(("edge", "recorded"), [(MESSAGES, CLAUDE[-1]), (RESPONSES, CODEX[-1])])
def test_at_a_later_step_instructions_are_pinned_and_tool_output_is_evidence(
    smollm2_tokenizer, edge, recorded
):
    body = recorded["body"]
    prepared = _prepared(smollm2_tokenizer, edge, body, mode="always")
    assert _uncovered(prepared, instruction_lines(body)) == []
    assert _uncovered(prepared, tool_schemas(body)) == []
    assert prepared.compress
    # the modules the agent read are scored, not pinned
    plan = prepared.plan
    text = plan.drafter.text
    source = "def _heapify_max" if "heapq" in text else "def insort_left"
    if source in text:
        at = text.index(source)
        assert not any(
            plan.drafter.char_span(s)[0] <= at < plan.drafter.char_span(s)[1] for s in plan.pinned()
        )


def test_a_reminder_inside_a_tool_result_is_kept_and_the_output_around_it_scored(
    smollm2_tokenizer,
):
    reminder = "<system-reminder>\nNever edit files outside the repository.\n</system-reminder>"
    body = {
        "model": "pflash",
        "max_tokens": 64,
        "system": "You are a coding agent.",
        "messages": [
            {"role": "user", "content": "Read notes.txt and summarise it."},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "notes.txt"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": FILE + "\n" + reminder}]},
        ],
        "tools": [{"name": "Read", "description": "Read a file.", "input_schema": {"type": "object"}}],
    }  # fmt: skip
    prepared = _prepared(smollm2_tokenizer, MESSAGES, body, mode="always")
    pinned = _pinned_text(prepared)
    assert reminder in pinned
    assert "line 200: the quick brown fox" not in pinned
    assert prepared.compress


def test_a_document_in_a_system_message_is_still_compressed_and_a_list_of_rules_is_not(
    smollm2_tokenizer,
):
    rules = "\n".join(
        f"- Rule {i}: always answer from the documents, never guess ({i})." for i in range(60)
    )
    document = "\n\n".join(f"Report section {i}. " + " ".join(["The harbour ledger lists cargo."] * 12) for i in range(30))  # fmt: skip
    body = {
        "model": "pflash",
        "max_tokens": 64,
        "system": f"You answer questions about reports.\n\n{rules}\n\n<documents>\n{document}\n</documents>\n\nAnswer in one sentence.",
        "messages": [{"role": "user", "content": "What does section 3 list?"}],
    }  # fmt: skip
    prepared = _prepared(smollm2_tokenizer, MESSAGES, body, mode="always")
    pinned = _pinned_text(prepared)
    assert rules in pinned and "Answer in one sentence." in pinned
    assert "Report section 17." not in pinned
    assert prepared.compress


def test_an_instruction_block_that_cannot_be_located_fails_closed(smollm2_tokenizer):
    """A template that rewrites what it is given cannot hide an instruction: planning fails
    naming the stage rather than serving it unpinned."""
    from pflash.compress.render.instructions import _located_blocks

    class NoRerender:
        def content_chars(self, k):
            return None

    chat = type("Chat", (), {"messages": ({"role": "user", "content": "<system-reminder>x</system-reminder>"},)})  # fmt: skip
    with pytest.raises(Exception) as err:
        _located_blocks("no such text", NoRerender(), None, chat, 0, [(0, 37)])
    assert getattr(err.value, "stage", None) == "span_validation"
    assert Span(0, 1)  # the planner's span type is what pins are made of


def test_an_agents_many_reminders_are_all_kept(smollm2_tokenizer):
    """An agent harness repeats its reminders turn after turn: more instruction spans than
    the reference's 64-span limit for required strings is still a valid plan, each kept."""
    turns = []
    for i in range(40):
        turns += [
            {"role": "assistant", "content": [{"type": "tool_use", "id": f"t{i}", "name": "Read", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"t{i}", "content": f"output {i}: " + "data " * 30},
                {"type": "text", "text": f"<system-reminder>Reminder {i}: keep the todo list current.</system-reminder>"},
                {"type": "text", "text": f"<system-reminder>Note {i}: the user is watching.</system-reminder>"},
            ]},
        ]  # fmt: skip
    body = {
        "model": "pflash",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Go through the files."}, *turns],
        "tools": [{"name": "Read", "input_schema": {"type": "object"}}],
    }
    prepared = _prepared(smollm2_tokenizer, MESSAGES, body, mode="always")
    assert len(prepared.plan.system) > 64
    pinned = _pinned_text(prepared)
    assert all(f"Reminder {i}: keep" in pinned and f"Note {i}: the" in pinned for i in range(40))
