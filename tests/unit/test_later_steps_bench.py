"""The later-steps benchmark runs a real conversation and reports what each step added."""

from __future__ import annotations

import pytest

from pflash_lab.bench import later_steps

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def steps():
    return later_steps.run_length(600, later_steps.load_parts())


def test_each_step_of_the_conversation_resumes_the_drafter_on_what_it_adds(steps):
    kinds = [s.kind for s in steps]
    assert kinds == ["first", "tool"] + ["question"] * len(later_steps.QUESTIONS)
    first, tool, *questions = steps
    assert first.drafter_new_tokens == first.prompt_tokens  # the whole prompt, once
    assert tool.drafter_new_tokens > 1000  # the test log, not the conversation again
    assert all(q.drafter_new_tokens < 60 for q in questions)  # a question's own tokens
    sizes = [s.prompt_tokens for s in steps]
    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes)
    # the drafter's call is part of each step's path, and the rest is what the ingress adds
    assert all(0 < s.drafter_ms < s.path_ms for s in steps)


def test_the_table_reports_medians_per_length(steps):
    text = later_steps.table(steps)
    assert "| 600 | 7 |" in text and text.count("\n") == 2
