"""The long-context benchmark's haystacks: what each question is judged on.

Pure logic over stand-in paragraphs: five needles of different animals at their depths,
two three-fact projects whose facts all sit in the text, questions that name what they ask
for, and a kept check that needs every answer.
"""

from __future__ import annotations

import pytest

from pflash_lab.bench.long_context import (
    ANIMALS,
    DEPTHS,
    MULTI_FACT_PER_HAYSTACK,
    build_haystack,
    kept,
    main,
    question_messages,
)

PARAGRAPHS = [
    f"Paragraph {i} of plain filler text about nothing in particular." for i in range(200)
]


def test_a_haystack_asks_five_needles_and_two_three_fact_projects():
    stack = build_haystack(PARAGRAPHS, DEPTHS, seed=3)
    families = [q.family for q in stack.questions]
    assert families == ["needle"] * 5 + ["multi_fact"] * MULTI_FACT_PER_HAYSTACK
    animals = {q.question.split("magic ")[1].split()[0] for q in stack.questions[:5]}
    assert len(animals) == 5  # each needle question has four same-shaped distractors
    for q in stack.questions:
        for answer in q.answers:
            assert stack.body.count(answer) >= 1
        assert len(q.answers) == (1 if q.family == "needle" else 3)
    assert all(p in stack.body for p in PARAGRAPHS)


def test_needles_sit_at_their_depths_of_the_text():
    stack = build_haystack(PARAGRAPHS, DEPTHS, seed=0)
    for q in stack.questions[:5]:
        at = stack.body.index(q.answers[0]) / len(stack.body)
        assert abs(at - q.depths[0]) < 0.05


def test_seeds_draw_other_numbers_and_other_text_order():
    one, two = build_haystack(PARAGRAPHS, DEPTHS, 0), build_haystack(PARAGRAPHS, DEPTHS, 1)
    assert one.body != two.body
    assert [q.answers for q in one.questions] != [q.answers for q in two.questions]
    assert build_haystack(PARAGRAPHS, DEPTHS, 0) == one  # a seed is reproducible


def test_a_multi_fact_question_is_kept_only_with_all_three_facts():
    stack = build_haystack(PARAGRAPHS, DEPTHS, seed=2)
    q = stack.questions[-1]
    budget, person, city = q.answers
    assert kept(q, f"{budget} ... {person} ... {city}")
    assert not kept(q, f"{budget} ... {person}")
    (message,) = question_messages(stack, q)
    assert message["content"].endswith(q.question)
    assert message["content"].startswith(stack.body)


def test_more_needle_depths_than_animals_is_an_error_naming_the_limit():
    depths = tuple((i + 1) / (len(ANIMALS) + 2) for i in range(len(ANIMALS) + 1))
    with pytest.raises(ValueError, match=f"at most {len(ANIMALS)} needle depths"):
        build_haystack(PARAGRAPHS, depths, seed=0)
    assert len(build_haystack(PARAGRAPHS, depths[:-1], seed=0).questions) == len(ANIMALS) + 2


def test_the_cli_refuses_too_many_depths_before_loading_anything(capsys):
    too_many = [str((i + 1) / 12) for i in range(len(ANIMALS) + 1)]
    with pytest.raises(SystemExit) as exit_:
        main(["--lengths", "8192", "--depths", *too_many])
    assert exit_.value.code == 2
    assert f"at most {len(ANIMALS)}" in capsys.readouterr().err
