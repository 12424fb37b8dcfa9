"""Keep ratio, budget over droppable tokens, the auto gate, and the target-token ceiling.

Pure functions over token counts and spans (reference §5.7). The budget is spent on
droppable tokens only: pinned content (system prompt, tools, the question, the generation
prompt) is charged first, then r0 of the rest is kept.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from pflash.compress.plan.query import Plan
from pflash.compress.plan.segments import (
    fitted_chunk_size,
    required_grid_tokens,
    scheduled_chunk_size,
)
from pflash.config import CompressionPart, GateConfig
from pflash.errors import CompressionFailed
from pflash.spans import Span, canonicalize


def curve_ratio(curve: tuple[tuple[int, float], ...], prompt_tokens: int) -> float:
    """Piecewise-linear interpolation over (tokens, ratio) points, flat outside them."""
    if not curve:
        raise ValueError("empty curve")
    if prompt_tokens <= curve[0][0]:
        return curve[0][1]
    if prompt_tokens >= curve[-1][0]:
        return curve[-1][1]
    for (t0, r0), (t1, r1) in zip(curve, curve[1:], strict=False):
        if t0 <= prompt_tokens <= t1:
            if t1 == t0:
                return r1
            return r0 + (r1 - r0) * (prompt_tokens - t0) / (t1 - t0)
    return curve[-1][1]


def configured_keep_ratio(config: GateConfig, prompt_tokens: int) -> float:
    """r0 for a prompt of `prompt_tokens` target tokens: the curve if set, else keep_ratio."""
    if config.curve:
        return curve_ratio(config.curve, prompt_tokens)
    return config.keep_ratio


# ------------------------------------------------------------------ budget over droppable tokens

GateReason = Literal[
    "mode_off",
    "always",
    "droppable_at_least_threshold",
    "droppable_below_threshold",
    "exceeds_context",
    "aggregate_question",
]


@dataclass(frozen=True)
class BudgetPlan:
    """The budget for one prompt (reference §5.7). Drafter-token and target-token fields say so.

    - `r0`: configured keep ratio over droppable tokens.
    - `kept_tokens`: K, drafter tokens in structurally required fixed chunks.
    - `keep_ratio`: effective r = min(1, (K + r0 (S - K) + 1) / S), as float32 (reference parity).
    - `budget`: floor(S r), drafter tokens: mandatory candidates are charged first, the rest is
      spent on the best-scoring droppable candidates.
    - `ceiling`: floor(prompt_tokens r), target tokens the final prompt may have (before the
      paragraph-join overhead).
    - `droppable`: prompt_tokens - target_estimate(K), target tokens compression can remove.
    - `compress` / `reason`: the gate decision (auto compresses iff droppable >= threshold).
    - `instruction_role_dropped`: instruction-role pins did not fit the context and are scored
      as ordinary context instead.
    - `pinned`: the merged pinned spans (drafter tokens) the selector must treat as mandatory.
    - `chunk_size`: the resolved fixed chunk size K was counted on (drafter tokens).
    """

    r0: float
    kept_tokens: int
    keep_ratio: float
    budget: int
    ceiling: int
    droppable: int
    compress: bool
    reason: GateReason
    instruction_role_dropped: bool
    pinned: tuple[Span, ...]
    chunk_size: int


def effective_keep_ratio(r0: float, kept_tokens: int, n_tokens: int) -> float:
    """r = min(1, (K + r0 (S - K) + 1) / S): r0 is spent on droppable tokens only.

    Computed in double, then rounded to float32 as the reference stores it (§11.2), so budgets
    match it to the token. Returned as the Python float of that float32 value.
    """
    if n_tokens <= 0:
        raise ValueError(f"n_tokens must be positive, got {n_tokens}")
    r = min(1.0, (kept_tokens + r0 * (n_tokens - kept_tokens) + 1.0) / n_tokens)
    return float(np.float32(r))


def target_estimate(prompt_tokens: int, drafter_tokens: int, n_tokens: int) -> int:
    """ceil(prompt_tokens * d / S): target tokens that `d` of the S drafter tokens are worth."""
    return -(-prompt_tokens * drafter_tokens // n_tokens)


def fits_context(
    prompt_tokens: int, drafter_tokens: int, n_tokens: int, max_ctx: int | None, max_output: int
) -> bool:
    """Whether keeping `drafter_tokens` leaves room for `max_output` in a `max_ctx` context
    (target tokens). No limit when max_ctx is None or <= 0."""
    if max_ctx is None or max_ctx <= 0:
        return True
    return target_estimate(prompt_tokens, drafter_tokens, n_tokens) + max_output <= max_ctx


def fitting_keep_ratio(
    prompt_tokens: int, kept_tokens: int, n_tokens: int, max_ctx: int, max_output: int
) -> float:
    """The largest r0 whose ceiling, floor(prompt_tokens * r), leaves room for max_output
    (at least 1) in the context: a prompt longer than the context is compressed to fit
    rather than refused. Inverts r = (K + r0 (S - K) + 1) / S; 0 when only the pins fit."""
    room = (max_ctx - max(1, max_output)) / prompt_tokens  # the largest r that fits
    if n_tokens <= kept_tokens:
        return 0.0
    return max(0.0, (room * n_tokens - kept_tokens - 1.0) / (n_tokens - kept_tokens))


def context_fit_failure(
    need: int, max_output: int, max_ctx: int | None, has_system: bool
) -> CompressionFailed:
    """What cannot be dropped does not fit the context: a client error (400) with the numbers
    (target tokens), naming the part that is too long. max_tokens alone filling the context
    names `max_tokens`."""
    if max_ctx is not None and max_output >= max_ctx:
        message = (
            f"max_tokens ({max_output}) leaves no room for the prompt in the context "
            f"({max_ctx}); lower max_tokens"
        )
    elif has_system:
        message = (
            f"the system prompt alone does not fit: its pinned content needs ~{need} target "
            f"tokens + max_tokens {max_output} > context {max_ctx}; PFlash does not "
            "compress system prompts - shorten the system prompt or max_tokens"
        )
    else:
        message = (
            f"what PFlash must keep (the question, the generation prompt, pflash_required) "
            f"needs ~{need} target tokens + max_tokens {max_output} > context {max_ctx}; "
            "shorten them or lower max_tokens"
        )
    param = "max_tokens" if max_ctx is not None and max_output >= max_ctx else "messages"
    return CompressionFailed("context_fit", message, client_error=True, param=param)


def plan_budget(
    *,
    n_tokens: int,
    prompt_tokens: int,
    r0: float,
    chunk_size: int,
    query: Span,
    required: Sequence[Span] = (),
    system: Sequence[Span] = (),
    instruction_role: Sequence[Span] = (),
    suffix_candidates: bool = False,
    mode: str = "auto",
    threshold: int = 0,
    max_ctx: int | None = None,
    max_output: int = 0,
    aggregate: bool = False,
) -> BudgetPlan:
    """Budget, ceiling and gate for strict selection over `n_tokens` (S) drafter tokens.

    `query` is the scorer query window and the span lists are a Plan's pins, all in drafter
    tokens; `prompt_tokens`, `threshold`, `max_ctx` and `max_output` are target tokens.

    Order (reference §5.7): K with every pin; if that does not fit the context, drop the
    instruction-role pins (they become ordinary scored context) and recount; if the required
    and system pins alone do not fit, fail with `CompressionFailed("context_fit")` - PFlash
    never compresses a system prompt's instructions (its documents are not pins, §5.5). Then
    the gate, then r, budget and ceiling.

    `aggregate`: the question is about the whole document (`aggregate.classify_question`).
    `auto` then serves a prompt that fits the context whole (reason `aggregate_question`):
    any selection distorts the counts and proportions such a question asks for.
    """
    if n_tokens <= 0:
        raise ValueError(f"n_tokens must be positive, got {n_tokens}")

    def kept(pins: tuple[Span, ...]) -> int:
        return required_grid_tokens(
            n_tokens, chunk_size, query=query, pinned=pins, suffix_candidates=suffix_candidates
        )

    pinned = canonicalize([*required, *system, *instruction_role])
    k = kept(pinned)
    dropped = False
    if not fits_context(prompt_tokens, k, n_tokens, max_ctx, max_output):
        if instruction_role:
            dropped = True
            pinned = canonicalize([*required, *system])
            k = kept(pinned)
        if not fits_context(prompt_tokens, k, n_tokens, max_ctx, max_output):
            raise context_fit_failure(
                target_estimate(prompt_tokens, k, n_tokens), max_output, max_ctx, bool(system)
            )

    droppable = prompt_tokens - target_estimate(prompt_tokens, k, n_tokens)
    over_context = max_ctx is not None and 0 < max_ctx < prompt_tokens + max(1, max_output)
    reason: GateReason
    if mode == "off":
        compress, reason = False, "mode_off"
    elif mode == "always":
        compress, reason = True, "always"
    elif mode == "auto" and over_context:
        compress, reason = True, "exceeds_context"  # served whole it cannot run at all
    elif mode == "auto" and droppable < threshold:
        compress, reason = False, "droppable_below_threshold"
    elif mode == "auto" and aggregate:
        compress, reason = False, "aggregate_question"
    elif mode == "auto":
        compress, reason = True, "droppable_at_least_threshold"
    else:
        raise ValueError(f"mode must be off, auto or always, got {mode!r}")

    if over_context:
        r0 = min(r0, fitting_keep_ratio(prompt_tokens, k, n_tokens, max_ctx, max_output))
    r = effective_keep_ratio(r0, k, n_tokens)
    return BudgetPlan(
        r0=r0,
        kept_tokens=k,
        keep_ratio=r,
        budget=math.floor(n_tokens * r),
        ceiling=math.floor(prompt_tokens * r),
        droppable=droppable,
        compress=compress,
        reason=reason,
        instruction_role_dropped=dropped,
        pinned=pinned,
        chunk_size=chunk_size,
    )


def plan_budget_for(
    plan: Plan,
    config: CompressionPart,
    *,
    prompt_tokens: int,
    max_ctx: int | None,
    max_output: int,
    r0: float | None = None,
    aggregate: bool = False,
) -> BudgetPlan:
    """`plan_budget` for a query Plan under `config` (strict selection).

    r0 defaults to the configured ratio (curve or keep_ratio); pass the adaptive controller's
    value instead when a session has one. The chunk size is `config.select_chunk_size` or the
    length schedule, never larger than the token budget at r0 (`fitted_chunk_size`).
    """
    s = plan.n_tokens
    r0 = configured_keep_ratio(config.gate, prompt_tokens) if r0 is None else r0
    chunk = fitted_chunk_size(scheduled_chunk_size(s, config.select_chunk_size), math.floor(s * r0))
    return plan_budget(
        n_tokens=s,
        prompt_tokens=prompt_tokens,
        r0=r0,
        chunk_size=chunk,
        query=plan.query,
        required=plan.required,
        system=plan.system,
        instruction_role=plan.instruction_role,
        suffix_candidates=plan.query_suffix_candidates,
        mode=config.mode,
        threshold=config.threshold,
        max_ctx=max_ctx,
        max_output=max_output,
        aggregate=aggregate,
    )
