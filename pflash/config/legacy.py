"""The legacy (v1) selector's knobs: one component, so the stages of the strict selector never
see them and a config that never opts into the legacy selector can ignore them."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from pflash.config.components import Component


class LegacySelectionConfig(Component):
    """The legacy (v1) selector, opt-in with `select_mode: legacy`, and its tail scorer,
    which `select_scorer: legacy` and `split` also use (reference §3.1, §4.1). Read by the
    request flow; the DrafterScorer reads `legacy_query_tokens` and `legacy_pool_kernel`.
    These keys were once under `selection`, and may still be written there."""

    moved_from: ClassVar[str | None] = "selection"

    legacy_chunk_size: int = Field(32, gt=0, description="Legacy selector chunk size.")
    legacy_query_tokens: int = Field(
        8, ge=1, le=512, description="Legacy tail scorer query rows (n_lookahead)."
    )
    legacy_pool_kernel: int = Field(
        13, ge=1, description="Legacy score smoothing width (in-range mean)."
    )
    legacy_head_chunks: int = Field(8, ge=0, description="Legacy: chunks forced at the head.")
    legacy_tail_chunks: int = Field(24, ge=0, description="Legacy: chunks forced at the tail.")
    anchor_radius: int | None = Field(
        None, ge=0, description="4-gram anchor radius in chunks; unset = tier by length."
    )
    anchor_max_hits: int | None = Field(
        None, ge=0, description="4-gram anchor hit cap; unset = tier by length."
    )
    repeat_min: int = Field(
        4, ge=1, description="Qwen3.5 legacy repeat-token rule: minimum frequency."
    )
    repeat_max: int = Field(
        32, ge=1, description="Qwen3.5 legacy repeat-token rule: maximum frequency."
    )
    legacy_repeat_rule: bool | None = Field(
        None, description="Legacy repeat-token rule; unset = by drafter profile (on for qwen35)."
    )
