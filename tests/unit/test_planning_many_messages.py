"""A chat of a thousand short messages is planned (issue 15 item 4).

How the planning time grows with the number of messages is a benchmark
(`python -m pflash.bench.planning`, BENCHMARKS.md); here the same code path runs once at
1,000 messages with 64 system messages spread through them, and the plan must come out
right: the latest user content is the question, every system message is pinned.
"""

from __future__ import annotations

from pflash.bench.planning import chat, measure


def test_a_thousand_messages_with_system_turns_are_planned_with_the_question_last(
    smollm2_tokenizer,
):
    from pflash.compress.pipeline import PromptInput, prepare
    from pflash.compress.rendered import render_chat_prompt
    from pflash.config import build_config

    messages = chat(1000, 64)
    assert sum(m["role"] == "system" for m in messages) == 64

    row = measure(smollm2_tokenizer, messages, repeats=1)
    assert row["tokens"] > 30_000
    assert all(row[k] >= 0 for k in ("render_ms", "plan_ms", "keys_ms"))

    prompt = render_chat_prompt(smollm2_tokenizer, messages)
    config = build_config({"mode": "always", "keep_ratio": 0.1}, env={})
    prepared = prepare(
        PromptInput(prompt_ids=prompt.ids, messages=messages, prompt_text=prompt.text),
        config=config,
        target_tokenizer=smollm2_tokenizer,
        drafter_tokenizer=smollm2_tokenizer,
    )
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
