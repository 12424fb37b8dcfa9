"""A chat of a thousand short messages is planned.

How the planning time grows with the number of messages is a benchmark
(`python -m pflash_lab.bench.planning`, docs/BENCHMARK_NOTEBOOK.md); here the same code path runs once at
1,000 messages with 64 system messages spread through them, and the plan must come out
right: the latest user content is the question, every system message is pinned.
"""

from __future__ import annotations

from pflash_lab.bench.planning import chat, plan_chat


def test_a_thousand_messages_with_system_turns_are_planned_with_the_question_last(
    smollm2_tokenizer,
):
    messages = chat(1000, 64)
    assert sum(m["role"] == "system" for m in messages) == 64

    prepared, _ = plan_chat(smollm2_tokenizer, messages)
    assert len(prepared.input.prompt.ids) > 30_000
    assert prepared.compress and prepared.score_request is not None
    plan = prepared.plan
    text = plan.drafter.text

    def read(span):
        begin, end = plan.drafter.char_span(span)
        return text[begin:end]

    assert read(plan.content) == "Which rule applies to message 7?"
    rules = [m["content"] for m in messages if m["role"] == "system"]
    pinned = "".join(read(s) for s in (*plan.system, *plan.instruction_role))
    assert all(rule in pinned for rule in rules)
