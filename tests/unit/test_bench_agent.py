"""The agent benchmark's trace generator (pflash_lab/bench/agent_trace.py): what the
benchmark's numbers rest on. A trace must be the same for a seed, reach its length, carry
each planted line in its early tool output, word its paraphrased questions without the
line's words, and send tool calls a client SDK would send."""

from __future__ import annotations

import json

import pytest

from pflash_lab.bench import agent as agent_bench
from pflash_lab.bench import agent_trace as at


@pytest.fixture(scope="module")
def count(smollm2_tokenizer):
    return lambda text: len(smollm2_tokenizer(text, add_special_tokens=False)["input_ids"])


@pytest.fixture(scope="module")
def traces(count):
    return {n: at.generate(count, n, seed=7) for n in (6000, 32768)}


def conversation_tokens(count, messages) -> int:
    return sum(at.message_tokens(count, m) for m in messages)


def test_same_seed_same_trace_other_seed_other_trace(count, traces):
    again = at.generate(count, 6000, seed=7)
    assert again == traces[6000]
    other = at.generate(count, 6000, seed=8)
    assert other.request(len(other.steps) - 1) != again.request(len(again.steps) - 1)


@pytest.mark.parametrize("n", [6000, 32768])
def test_trace_reaches_its_length_without_passing_it(count, traces, n):
    trace = traces[n]
    last = trace.request(len(trace.steps) - 1)
    total = conversation_tokens(count, last)
    assert 0.85 * n <= total <= n
    # the step's own count agrees with an independent count of its request
    assert abs(trace.steps[-1].tokens - total) <= 0.05 * n


def test_tool_outputs_are_one_to_eight_k_tokens_at_32k(count, traces):
    sizes = [count(s.messages[1]["content"]) for s in traces[32768].steps if s.kind == "tool"]
    lo, hi = at.size_range(32768)
    assert (lo, hi) == (1000, 5461)
    # every output but a diff of a short file and the last (it fills what is left) is in range
    inside = [lo // 2 <= x <= hi for x in sizes]
    assert sum(inside) >= len(sizes) - 3
    assert max(sizes) > 2000


def test_each_fact_is_planted_whole_in_its_early_tool_output(traces):
    trace = traces[6000]
    tool_steps = [s for s in trace.steps if s.kind == "tool"]
    for fact in trace.facts:
        step = tool_steps[fact.step]
        assert step.tool == fact.tool and step.fact == fact.name
        assert fact.line in step.messages[1]["content"].splitlines()
        later = [s for s in tool_steps if s is not step]
        assert not any(fact.line in s.messages[1]["content"] for s in later)


def test_questions_come_after_the_facts_and_cover_both_classes(traces):
    trace = traces[32768]
    questions = [s for s in trace.steps if s.kind == "question"]
    assert len(questions) >= 6
    first_question = questions[0].index
    assert all(s.kind == "tool" for s in trace.steps[:first_question])
    assert first_question >= 3
    pairs = {(q.fact, q.question_class) for q in questions[:6]}
    assert pairs == {(f.name, c) for f in trace.facts for c in ("literal", "paraphrase")}
    for q in questions:
        fact = next(f for f in trace.facts if f.name == q.fact)
        assert q.evidence == fact.line and q.answer in fact.line
        assert fact in trace.planted_before(q.index)


def test_literal_questions_share_the_lines_words_paraphrases_share_none():
    import random

    for seed in range(5):
        for fact in at.make_facts(random.Random(seed)):
            for text in fact.literal:
                assert at.shares_content_word(text, fact.line), text
            for text in fact.paraphrase:
                assert not at.shares_content_word(text, fact.line), (text, fact.line)
                assert fact.answer not in text


def test_shared_stem_counts_as_a_shared_word():
    assert at.content_words("MAX_RETRY_BUDGET = 17") == {"max", "retry", "budget", "17"}
    assert at.content_words("staleLockSeconds") == {"stale", "lock", "seconds"}
    assert at.shares_content_word("How many retries?", "MAX_RETRY_BUDGET = 17")
    assert not at.shares_content_word("How many attempts?", "MAX_RETRY_BUDGET = 17")


def test_tool_calls_are_well_formed_openai_calls(traces):
    names = {t["function"]["name"] for t in at.TOOLS}
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in at.TOOLS}
    for trace in traces.values():
        ids = set()
        for step in trace.steps:
            if step.kind != "tool":
                assert [m["role"] for m in step.messages + step.after] == ["user", "assistant"]
                continue
            call, out = step.messages
            assert call["role"] == "assistant" and call["content"] is None
            (tc,) = call["tool_calls"]
            assert tc["type"] == "function" and tc["function"]["name"] in names
            args = json.loads(tc["function"]["arguments"])
            assert set(schemas[tc["function"]["name"]]["required"]) <= set(args)
            assert out == {"role": "tool", "tool_call_id": tc["id"], "content": out["content"]}
            assert tc["id"] not in ids and out["content"]
            ids.add(tc["id"])


def test_a_request_is_the_earlier_request_plus_what_the_step_adds(traces):
    trace = traces[6000]
    for i in range(1, len(trace.steps)):
        before, now = trace.request(i - 1, "h"), trace.request(i, "h")
        assert now[: len(before)] == before
        assert now[len(before) :] == [*trace.steps[i - 1].after, *trace.steps[i].messages]
    assert trace.request(0, "Session 1")[0]["content"].startswith("Session 1\n")


def _row(step, kind, on, full, cls=None, kept=None):
    row = {
        "length": 6000,
        "step": step,
        "kind": kind,
        "tool": "grep" if kind == "tool" else None,
        "fact": "config" if cls else None,
        "question_class": cls,
        "prompt_tokens": 1000,
        "added_tokens": 500,
        "served_tokens": 100,
        "ttft_pflash_ms": on,
        "ttft_full_ms": full,
        "ratio": full / on,
        "compress_ms": 10.0,
        "queue_ms": 1.0,
        "view": "continue",
        "reused_tokens": 90,
        "delta_tokens": 10,
        "recalled_tokens": 0,
        "evidence_held": {"config": True, "log": kept is not False},
        **{k: 1.0 for k in agent_bench.STAGES},
    }
    if kind == "question":
        row["evidence_kept"] = kept
    return row


def test_summary_sums_ttft_per_class_and_counts_evidence_by_class():
    rows = [
        _row(0, "tool", 1000, 3000),
        _row(1, "tool", 1000, 1000),
        _row(2, "question", 2000, 500, "literal", True),
        _row(3, "question", 1000, 500, "paraphrase", False),
    ]
    line = agent_bench.summary(rows).splitlines()[2]
    cells = [c.strip() for c in line.split("|")[1:-1]]
    assert cells[:5] == ["6,000", "4", "5.0 s", "5.0 s", "**1.00×**"]
    assert cells[5] == "0.33× (3.0 s vs 1.0 s; median 0.38×)"
    assert cells[6] == "2.00× (2.0 s vs 4.0 s; median 2.00×)"
    assert cells[7] == "0.25× (step 2, question)"
    assert cells[8:] == ["1/1", "0/1", "7/8"]
    table = agent_bench.step_table(rows)
    assert "Q config paraphrase" in table and "**lost**" in table


def test_messages_and_responses_bodies_carry_the_chat_conversation(traces):
    """What the server's edges make of the bench's bodies: the chat trace itself through
    /v1/messages; through /v1/responses the same turns, except that the server folds an
    assistant reply and the tool call after it into one assistant message."""
    from pflash.serving.chat_completion.protocol import ChatCompletionRequest
    from pflash.serving.messages.translate import EDGE as MESSAGES
    from pflash.serving.responses.translate import EDGE as RESPONSES

    trace = traces[6000]
    chat_msgs = trace.request(len(trace.steps) - 1, "Session A")
    chat = ChatCompletionRequest.model_validate(
        {"model": "pflash", "messages": chat_msgs, "tools": list(trace.tools), "max_tokens": 16}
    )
    system, messages = agent_bench.to_messages_api(chat_msgs)
    via_messages = MESSAGES.parse(
        {
            "model": "pflash",
            "system": system,
            "messages": messages,
            "tools": agent_bench.messages_tools(trace.tools),
            "max_tokens": 16,
        }
    ).chat
    instructions, items = agent_bench.to_responses_api(chat_msgs)
    via_responses = RESPONSES.parse(
        {
            "model": "pflash",
            "instructions": instructions,
            "input": items,
            "tools": agent_bench.responses_tools(trace.tools),
            "max_output_tokens": 16,
        }
    ).chat

    def dump(req):
        return [m.model_dump(exclude_none=True) for m in req.messages]

    assert dump(via_messages) == dump(chat)
    tools = [t.model_dump(exclude_none=True) for t in chat.tools]
    assert [t.model_dump(exclude_none=True) for t in via_messages.tools] == tools
    assert [t.model_dump(exclude_none=True) for t in via_responses.tools] == tools
    contents = [m["content"] for m in dump(chat) if m.get("content")]
    assert [m["content"] for m in dump(via_responses) if m.get("content")] == contents
    calls = [c for m in dump(chat) for c in m.get("tool_calls", ())]
    assert [c for m in dump(via_responses) for c in m.get("tool_calls", ())] == calls
