"""What every API's answer reports: OpenAI's `usage` with llama.cpp-style `usage.timings` and
PFlash's `usage.timings.pflash` (`PFlashStats`, ALGORITHM §5.9). The Messages and Responses
APIs write the same numbers in their own terms."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pflash.models.target.protocol import GenerationTimings
from pflash.views.records import ViewMode


class ViewStats(BaseModel):
    """The multi-turn view outcome (ALGORITHM §6.1), in target tokens. "off": no view."""

    model_config = ConfigDict(extra="forbid")

    mode: ViewMode = "off"
    turn: int = 0
    served_tokens: int = 0
    reused_tokens: int = 0
    delta_tokens: int = 0
    recalled_tokens: int = 0
    fresh_tokens: int = 0


class PFlashStats(BaseModel):
    """`usage.timings.pflash` (ALGORITHM §5.9). Defaults describe an uncompressed request.

    Units: `*_ms` milliseconds (`compress_ms` rounded to 0.1); where compression time goes:
    `plan_ms` (planning before the drafter: queries, pinned spans, token mapping, budget),
    `scorer_forward_ms` (the drafter's forward), `select_ms` (selection, assembly, the
    ceiling), and `compress_ms` from the end of planning to the served prompt (the drafter's
    queue and transfer are `compress_ms - scorer_forward_ms - select_ms`); `drafter_wait_ms`
    from the drafter call to its scores in the flow (queue, forward, the embedder and
    projection passes, transfer), `probe_wait_ms` from that call to the segment probe's
    boundaries (0 without a probe), `view_ms` the view lookup and decision before the drafter
    is called (0 without a view); `drafter_input_tokens` and
    `kept_tokens` drafter tokens; `compressed_tokens` target tokens served; `served_ratio`
    served / original target tokens on every path (1.0 when served as sent); `keep_ratio`
    an alias of `served_ratio`, always equal to it (kept for clients that read this name);
    `budget_ratio` the keep ratio the budget applied, r0 over droppable tokens (configured,
    curve, adaptive or the request's `pflash_keep_ratio`, after the cap that fits an
    over-long prompt into the context), null when the prompt was served as sent; `segments` candidate segments; `scorer_resume` the token
    position the drafter session resumed from; `lexical_units` / `lexical_kept` the text
    units sharing rare words with the question and how many of them were kept first
    (`select_lexical`), `lexical_units_reused` how many of the context's units came from the
    conversation's earlier turn instead of being cut and read again; `semantic_passages` / `semantic_ms` the passages the sentence
    embedder scored and that pass's time, part of `scorer_forward_ms`
    (`select_semantic_weight`), `semantic_blocks` the code blocks (functions, classes) it
    also read whole, `semantic_reused` how many of its texts
    (passages and question parts) came from the conversation's earlier turns instead of
    being embedded again, `semantic_prefetched` passages after the question (tool outputs
    since the user last spoke) embedded for the next question; `projection_passages` / `projection_ms` the
    same for the tap projection (`select_projection_weight`); `question_kind` the kind of a
    question about the whole document (frequency, count, enumerate, summary; null for any
    other question), which `auto` serves whole and `always` answers with a uniform sample
    of the document's units. Unknown keys are an error, so the pipeline's
    stats and this contract cannot drift apart silently.
    """

    model_config = ConfigDict(extra="forbid")

    compress_ms: float = 0.0
    plan_ms: float = 0.0
    select_ms: float = 0.0
    drafter_wait_ms: float = 0.0
    probe_wait_ms: float = 0.0
    view_ms: float = 0.0
    drafter_input_tokens: int = 0
    kept_tokens: int = 0
    compressed_tokens: int = 0
    served_ratio: float = 1.0
    keep_ratio: float = 1.0
    budget_ratio: float | None = None
    query_rule: str = ""
    history_queries: int = 0
    segments: int = 0
    stop_reason: str = ""
    scorer_resume: int = 0
    scorer_new_tokens: int = 0
    scorer_forward_ms: float = 0.0
    lexical_units: int = 0
    lexical_kept: int = 0
    lexical_units_reused: int = 0
    semantic_passages: int = 0
    semantic_blocks: int = 0
    semantic_ms: float = 0.0
    semantic_reused: int = 0
    semantic_prefetched: int = 0
    projection_passages: int = 0
    projection_ms: float = 0.0
    question_kind: Literal["frequency", "count", "enumerate", "summary"] | None = None
    view: ViewStats = Field(default_factory=ViewStats)

    @model_validator(mode="before")
    @classmethod
    def _keep_ratio_is_served_ratio(cls, data: Any) -> Any:
        """`keep_ratio` is an alias: either name sets both; two different values are an
        error, so the two fields can never disagree."""
        if not isinstance(data, dict):
            return data
        served, keep = data.get("served_ratio"), data.get("keep_ratio")
        if served is not None and keep is not None and served != keep:
            raise ValueError(f"keep_ratio ({keep}) is an alias of served_ratio ({served})")
        value = served if served is not None else keep
        return data if value is None else {**data, "served_ratio": value, "keep_ratio": value}

    @field_validator("compress_ms")
    @classmethod
    def _tenth_of_ms(cls, v: float) -> float:
        return round(v, 1)

    @classmethod
    def uncompressed(cls, prompt_tokens: int) -> PFlashStats:
        """Stats of a request served as is: all `prompt_tokens` served, ratio 1."""
        return cls(compressed_tokens=prompt_tokens, served_ratio=1.0)


def pflash_stats(stats: Mapping[str, Any]) -> PFlashStats:
    """`usage.timings.pflash` of a compression's stats (`Compressed.stats`): the contract's
    fields; the flow's other keys stay internal."""
    fields = {k: v for k, v in stats.items() if k in PFlashStats.model_fields}
    if isinstance(fields.get("view"), dict):
        fields["view"] = ViewStats(**fields["view"])
    return PFlashStats(**fields)


class Timings(BaseModel):
    """llama.cpp-style generation timings plus PFlash's stats."""

    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    cache_n: int
    pflash: PFlashStats = Field(default_factory=PFlashStats)


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    """`prompt_tokens` is the client's original prompt, not the compressed one (§8.2)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    timings: Timings


def build_usage(
    prompt_tokens: int, timings: GenerationTimings, pflash: PFlashStats | None = None
) -> Usage:
    """Usage of one generation: completion = sampled tokens, cached = reused prefix tokens."""
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=timings.predicted_n,
        total_tokens=prompt_tokens + timings.predicted_n,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=timings.cache_n),
        timings=Timings(
            prompt_n=timings.prompt_n,
            prompt_ms=round(timings.prompt_ms, 3),
            predicted_n=timings.predicted_n,
            predicted_ms=round(timings.predicted_ms, 3),
            cache_n=timings.cache_n,
            pflash=pflash or PFlashStats.uncompressed(prompt_tokens),
        ),
    )
