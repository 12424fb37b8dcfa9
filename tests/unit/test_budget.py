"""Keep ratio, budget over droppable tokens, context fit and the auto gate (ALGORITHM.md §5.7,
§11.2, §10.2 item 30). Drafter-token and target-token quantities are named as such."""

from __future__ import annotations

import math

import pytest

from pflash.compress.plan.budget import (
    configured_keep_ratio,
    curve_ratio,
    effective_keep_ratio,
    fits_context,
    plan_budget,
    plan_budget_for,
    target_estimate,
)
from pflash.compress.plan.query import Plan
from pflash.config import build_config
from pflash.errors import CompressionFailed
from pflash.spans import Span, TokenizedText

# --------------------------------------------------------------------------- configured ratio


def test_curve_interpolates_and_clamps():
    """Item 30: points (10000, .5), (40000, .2), (100000, .1)."""
    curve = ((10000, 0.5), (40000, 0.2), (100000, 0.1))
    assert curve_ratio(curve, 5000) == 0.5
    assert curve_ratio(curve, 25000) == pytest.approx(0.35)
    assert curve_ratio(curve, 70000) == pytest.approx(0.15)
    assert curve_ratio(curve, 200000) == 0.1


def test_configured_ratio_prefers_the_curve():
    assert configured_keep_ratio(build_config({"keep_ratio": 0.3}, env={}), 50000) == 0.3
    config = build_config({"keep_ratio": 0.3, "curve": "10000:0.5 40000:0.2"}, env={})
    assert configured_keep_ratio(config, 50000) == 0.2


# --------------------------------------------------------------------------- effective ratio


def test_worked_example_effective_ratio_budget_and_ceiling():
    """§1.1: S=20000 with K=2000 pinned and r0=0.05 -> r=0.14505, budget 2901, ceiling
    floor(prompt_tokens * r). K here: chunk 0 holds the system pin, the last chunk the query."""
    plan = plan_budget(
        n_tokens=20000,
        prompt_tokens=18000,
        r0=0.05,
        chunk_size=1000,
        query=Span(19999, 20000),
        system=(Span(0, 400),),
        mode="always",
    )
    assert plan.kept_tokens == 2000
    assert plan.keep_ratio == pytest.approx(0.14505, rel=1e-7)
    assert plan.budget == 2901
    assert plan.ceiling == math.floor(18000 * plan.keep_ratio) == 2610


def test_effective_ratio_is_rounded_to_float32_like_the_reference():
    """§11.2: (0 + 0.05*1000 + 1)/1000 = 0.051 in double gives 51 tokens, but the reference
    stores r as float32 (0.0509999990...), so its budget is 50."""
    r = effective_keep_ratio(0.05, 0, 1000)
    assert r != 0.051
    assert math.floor(1000 * 0.051) == 51
    assert math.floor(1000 * r) == 50


def test_effective_ratio_is_capped_at_one():
    assert effective_keep_ratio(0.5, 999, 1000) == 1.0


def test_budget_always_covers_the_mandatory_chunks():
    plan = plan_budget(
        n_tokens=3000, prompt_tokens=2500, r0=0.01, chunk_size=512, query=Span(2990, 3000)
    )
    assert plan.kept_tokens == 3000 - 2560  # the short last chunk
    assert plan.budget >= plan.kept_tokens + math.floor(0.01 * (3000 - plan.kept_tokens))


def test_suffix_candidates_do_not_count_the_tail_as_kept():
    common = dict(
        n_tokens=4096, prompt_tokens=4096, r0=0.1, chunk_size=1024, query=Span(1000, 1008)
    )
    chat = plan_budget(**common)
    agent = plan_budget(**common, suffix_candidates=True)
    assert chat.kept_tokens == 4096  # query chunk and everything after it
    assert agent.kept_tokens == 1024


# --------------------------------------------------------------------------- context fit


def test_target_estimate_rounds_up():
    assert target_estimate(prompt_tokens=1000, drafter_tokens=1, n_tokens=3) == 334
    assert target_estimate(prompt_tokens=900, drafter_tokens=1, n_tokens=3) == 300


def test_fits_context_without_limit():
    assert fits_context(10**6, 10**6, 10**6, None, 10**6)
    assert fits_context(10**6, 10**6, 10**6, 0, 10**6)
    assert fits_context(100, 50, 100, 100, 50)
    assert not fits_context(100, 51, 100, 100, 50)


def _fit_plan(**overrides):
    args = dict(
        n_tokens=10000,
        prompt_tokens=10000,
        r0=0.05,
        chunk_size=1000,
        query=Span(9999, 10000),
        required=(Span(9990, 10000),),
        system=(Span(0, 500),),
        instruction_role=(Span(2000, 4500),),
        max_ctx=4096,
        max_output=1000,
    )
    args.update(overrides)
    return plan_budget(**args)


def test_auto_serves_a_question_about_the_whole_document_whole_when_it_fits():
    plan = _fit_plan(mode="auto", threshold=2048, max_ctx=32768, aggregate=True)
    assert not plan.compress and plan.reason == "aggregate_question"
    plain = _fit_plan(mode="auto", threshold=2048, max_ctx=32768)
    assert plain.compress and plain.reason == "droppable_at_least_threshold"


def test_a_question_about_the_whole_document_is_compressed_in_always_or_over_the_context():
    assert _fit_plan(mode="always", max_ctx=32768, aggregate=True).compress
    over = _fit_plan(mode="auto", threshold=2048, max_ctx=8192, max_output=64, aggregate=True)
    assert over.compress and over.reason == "exceeds_context"
    short = _fit_plan(mode="auto", threshold=9000, max_ctx=32768, aggregate=True)
    assert short.reason == "droppable_below_threshold"


def test_instruction_role_pins_are_kept_when_they_fit():
    plan = _fit_plan(max_ctx=6000)
    assert not plan.instruction_role_dropped
    assert plan.kept_tokens == 5000  # chunks 0, 2, 3, 4, 9
    assert Span(2000, 4500) in plan.pinned


def test_instruction_role_pins_are_dropped_when_they_do_not_fit():
    plan = _fit_plan()
    assert plan.instruction_role_dropped
    assert plan.kept_tokens == 2000  # chunk 0 (system) and chunk 9 (query)
    assert plan.pinned == (Span(0, 500), Span(9990, 10000))


def test_system_prompt_alone_too_large_fails_closed():
    with pytest.raises(CompressionFailed) as err:
        _fit_plan(system=(Span(0, 3500),))
    assert err.value.stage == "context_fit"
    assert "system prompt alone does not fit" in err.value.message
    assert "does not compress system prompts" in err.value.message


def test_mandatory_part_over_the_context_is_a_400_naming_what_and_the_numbers():
    from pflash.serving.envelope import error_response

    with pytest.raises(CompressionFailed) as err:  # no system prompt: the question is too long
        _fit_plan(system=(), instruction_role=(), required=(Span(6000, 10000),))
    status, body = error_response(err.value)
    assert status == 400 and body["error"]["param"] == "messages"
    assert "system prompt" not in err.value.message
    assert "~4000 target tokens + max_tokens 1000 > context 4096" in err.value.message


def test_max_tokens_filling_the_context_is_a_400_naming_max_tokens():
    from pflash.serving.envelope import error_response

    with pytest.raises(CompressionFailed) as err:
        _fit_plan(system=(), instruction_role=(), max_output=5000)
    status, body = error_response(err.value)
    assert status == 400 and body["error"]["param"] == "max_tokens"
    assert "max_tokens (5000)" in err.value.message and "(4096)" in err.value.message


# --------------------------------------------------------------------------- auto gate


def test_auto_compresses_when_droppable_reaches_threshold():
    plan = _fit_plan(max_ctx=None, mode="auto", threshold=8000)
    assert plan.droppable == 10000 - 5000
    assert not plan.compress
    assert plan.reason == "droppable_below_threshold"
    plan = _fit_plan(max_ctx=None, mode="auto", threshold=5000)
    assert plan.compress
    assert plan.reason == "droppable_at_least_threshold"


def test_auto_compresses_a_prompt_over_the_context_to_fit_even_below_the_threshold():
    # 10,000 tokens on a 4,096-token context: served whole it cannot run at all
    plan = _fit_plan(mode="auto", threshold=10**9, instruction_role=(), r0=0.5)
    assert plan.compress and plan.reason == "exceeds_context"
    assert plan.ceiling + 1000 <= 4096  # the context minus max_tokens
    assert plan.r0 < 0.5
    fitting = _fit_plan(mode="auto", threshold=10**9, instruction_role=(), max_ctx=20_000)
    assert not fitting.compress and fitting.reason == "droppable_below_threshold"
    assert fitting.r0 == 0.05  # a prompt that fits keeps its configured ratio


def test_a_ratio_that_would_overflow_the_context_is_lowered_in_always_mode_too():
    plan = _fit_plan(mode="always", instruction_role=(), r0=0.9)
    assert plan.ceiling + 1000 <= 4096 and plan.budget >= plan.kept_tokens


def test_always_and_off_ignore_the_threshold():
    assert _fit_plan(max_ctx=None, mode="always", threshold=10**9).compress
    off = _fit_plan(max_ctx=None, mode="off", threshold=0)
    assert not off.compress
    assert off.reason == "mode_off"


def test_droppable_is_in_target_tokens():
    # 2 target tokens per drafter token: the 1000 kept drafter tokens are worth 2000 target tokens
    plan = plan_budget(
        n_tokens=5000,
        prompt_tokens=10000,
        r0=0.05,
        chunk_size=1000,
        query=Span(4999, 5000),
        mode="auto",
        threshold=8000,
    )
    assert plan.kept_tokens == 1000
    assert plan.droppable == 8000
    assert plan.compress


# --------------------------------------------------------------------------- from a Plan


def test_plan_budget_for_reads_the_plan_and_config():
    n = 6000
    drafter = TokenizedText(
        text="x" * n, ids=tuple(range(n)), offsets=tuple((i, i + 1) for i in range(n))
    )
    plan = Plan(
        drafter=drafter,
        query_span=Span(5990, 6000),
        query=Span(5992, 6000),
        query_rule="prompt_end",
        system=(Span(0, 10),),
        instruction_role=(Span(1100, 1200),),
    )
    config = build_config(
        {"keep_ratio": 0.1, "mode": "auto", "threshold": 100, "select_chunk_size": None}, env={}
    )
    budget = plan_budget_for(plan, config, prompt_tokens=4800, max_ctx=None, max_output=0)
    # S = 6000 -> scheduled 1024 (the reference's schedule), cut to the budget floor(6000 * 0.1)
    assert budget.chunk_size == 600
    assert budget.kept_tokens == 600 + 600 + 600  # system, instruction, query chunks
    assert budget.r0 == 0.1
    assert budget.compress
    adaptive = plan_budget_for(plan, config, prompt_tokens=4800, max_ctx=None, max_output=0, r0=0.2)
    assert adaptive.r0 == 0.2
    assert adaptive.budget > budget.budget


@pytest.mark.parametrize("chunk", [64, 512, None])
def test_chunk_never_exceeds_the_token_budget_whatever_the_config_says(chunk):
    """A pin makes its whole chunk mandatory: with 512-token chunks a 1.4K-token chat at
    keep 0.1 (budget 140) kept 0.67 of its prompt. The chunk is cut to the budget."""
    n = 1400
    drafter = TokenizedText(
        text="x" * n, ids=tuple(range(n)), offsets=tuple((i, i + 1) for i in range(n))
    )
    plan = Plan(
        drafter=drafter,
        query_span=Span(1380, 1400),
        query=Span(1392, 1400),
        query_rule="prompt_end",
        system=(Span(0, 12),),
    )
    config = build_config({"keep_ratio": 0.1, "mode": "always", "select_chunk_size": chunk}, env={})
    budget = plan_budget_for(plan, config, prompt_tokens=n, max_ctx=None, max_output=0)
    assert budget.chunk_size <= 140
    assert budget.chunk_size == (64 if chunk == 64 else 140)
    # the system pin and the question cost two chunks, not two 512-token blocks
    assert budget.kept_tokens <= 2 * 140 and budget.keep_ratio < 0.3


def test_fitted_chunk_size_allows_64_tokens_and_keeps_smaller_chunks():
    from pflash.compress.plan.segments import MIN_CHUNK_TOKENS, fitted_chunk_size

    assert fitted_chunk_size(64, 1000) == 64
    assert fitted_chunk_size(512, 140) == 140
    assert fitted_chunk_size(512, 3) == MIN_CHUNK_TOKENS == 64
    assert fitted_chunk_size(32, 3) == 32  # a configured smaller chunk stays
