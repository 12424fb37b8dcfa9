"""Keep ratio, budget over droppable tokens, the auto gate, and the target-token ceiling.

Pure functions over token counts and spans (reference §5.7). The budget is spent on
droppable tokens only: pinned content (system prompt, tools, the question, the generation
prompt) is charged first, then r0 of the rest is kept.
"""

from __future__ import annotations

from pflash.config import PFlashConfig


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


def configured_keep_ratio(config: PFlashConfig, prompt_tokens: int) -> float:
    """r0 for a prompt of `prompt_tokens` target tokens: the curve if set, else keep_ratio."""
    if config.curve:
        return curve_ratio(config.curve, prompt_tokens)
    return config.keep_ratio
