"""The in-process agent replay (pflash_lab/bench/agent_replay.py): each step of a real trace
goes through the server's flow, and each question is scored on what was actually served."""

from __future__ import annotations

import pytest

from pflash_lab.bench import agent_replay, agent_trace, later_steps

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def parts():
    return later_steps.load_parts({"chat_compress_new_tokens": 256})


@pytest.fixture(scope="module")
def trace(parts):
    tokenizer = parts["tokenizer"]
    return agent_trace.generate(
        lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"]), 2500, seed=3
    )


@pytest.fixture(scope="module")
def rows(trace, parts):
    return agent_replay.replay(trace, parts)


def test_every_step_is_served_from_the_conversations_view(trace, rows):
    assert [r["kind"] for r in rows] == [s.kind for s in trace.steps]
    assert rows[0]["view"] == "fresh"
    assert all(r["view"] in ("continue", "continue-compressed", "rebuild") for r in rows[1:])
    # tool outputs (400+ tokens here, over the 256 set above) are compressed as they arrive
    tools = [r for r in rows[1:] if r["kind"] == "tool"]
    assert tools and all(r["view"] == "continue-compressed" for r in tools)
    assert all(r["served_tokens"] < r["prompt_tokens"] for r in rows)


def test_each_question_is_judged_on_the_served_text_and_summed(trace, rows):
    questions = [r for r in rows if r["kind"] == "question"]
    assert questions and all(isinstance(r["evidence_kept"], bool) for r in questions)
    literal = [r for r in questions if r["question_class"] == "literal"]
    assert literal and all(r["evidence_kept"] for r in literal)  # named evidence is recalled
    total = agent_replay.summary(rows)
    assert total["sessions"] == 1
    assert total["literal"] == f"{len(literal)}/{len(literal)}"
    kept = sum(r["evidence_kept"] for r in questions)
    assert len(total["missed"]) == len(questions) - kept
    assert total["served_tokens"] == sum(r["served_tokens"] for r in rows)
