"""Which candidate spans survive compression (all spans half-open, in drafter tokens; pure
functions over numpy arrays, nothing loops per token):

- `candidates`: the spans to choose from, lexical splits and promotions;
- `strict`: the strict and split selectors and the assembly-overhead fit;
- `legacy`: the reference's v1 selector.

The package exports every public name, so callers import from `pflash.compress.selection`."""

from __future__ import annotations

from pflash.compress.selection.candidates import (
    Candidates,
    ScoreKind,
    SelectMode,
    StopReason,
    build_candidates,
    promote_spans,
    resolve_score_kind,
    span_sums,
    split_candidates,
)
from pflash.compress.selection.legacy import (
    LegacyParams,
    LegacySelection,
    anchor_chunks,
    anchor_tier,
    head_tail_counts,
    legacy_n_keep,
    legacy_smooth,
    repeat_token_chunks,
    select_legacy,
)
from pflash.compress.selection.strict import (
    SelectionResult,
    kept_spans,
    merge_runs,
    ranked_candidates,
    select_candidates,
    select_split,
    validate_candidates,
)

__all__ = [
    "SelectMode",
    "ScoreKind",
    "StopReason",
    "Candidates",
    "span_sums",
    "resolve_score_kind",
    "build_candidates",
    "split_candidates",
    "promote_spans",
    "SelectionResult",
    "validate_candidates",
    "select_candidates",
    "select_split",
    "merge_runs",
    "kept_spans",
    "ranked_candidates",
    "LegacyParams",
    "LegacySelection",
    "legacy_smooth",
    "legacy_n_keep",
    "head_tail_counts",
    "anchor_tier",
    "anchor_chunks",
    "repeat_token_chunks",
    "select_legacy",
]
