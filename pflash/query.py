"""Scorer query windows and pinned spans for one prompt: the plan the scorer and selector use.

Everything here is in **drafter tokens** over `Plan.drafter.ids` (the drafter's encoding
of the target prompt text). Reference: ALGORITHM.md §5.4-§5.6.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pflash.spans import Span, TokenizedText, canonicalize

WindowKind = Literal["main", "turn", "history"]


@dataclass(frozen=True)
class QueryWindow:
    """One scorer query window (drafter tokens) and its weight in the mass mix (§3.3)."""

    span: Span
    weight: float
    kind: WindowKind


@dataclass(frozen=True)
class Plan:
    """What the scorer queries with and what must never be dropped, for one prompt.

    - `query_span`: the whole query span (pinned). `query`: the main scorer window, the last
      min(query_tokens, len(query_span)) tokens of it: `[query_begin, query_end)`.
    - `turn_query`: tail of the latest user turn (prompt_end rule), weight 1, used only when
      it ends at or before `query.begin`.
    - `history`: earlier questions, most recent first; entry i has weight 2^-(i+1) and an
      entry that is None or does not end at or before `query.begin` is skipped **but still
      consumes its weight slot** (reference §3.3, §12 item 4).
    - `required` / `system`: always kept. `instruction_role`: kept when they fit the
      context, else scored as ordinary context (§5.5, §5.7).
    - `query_suffix_candidates`: agent loop: tokens after the query are scored candidates
      instead of being kept structurally.
    """

    drafter: TokenizedText
    query_span: Span
    query: Span
    query_rule: str
    turn_query: Span | None = None
    history: tuple[Span | None, ...] = ()
    required: tuple[Span, ...] = ()
    system: tuple[Span, ...] = ()
    instruction_role: tuple[Span, ...] = ()
    query_suffix_candidates: bool = False
    generation_begin: int | None = None

    @property
    def n_tokens(self) -> int:
        return len(self.drafter.ids)

    def windows(self) -> tuple[QueryWindow, ...]:
        """Weighted windows for the head scorer, in the reference's order and weights."""
        out = [QueryWindow(self.query, 1.0, "main")]
        if self.turn_query is not None and not self.turn_query.empty and self.turn_query.end <= self.query.begin:
            out.append(QueryWindow(self.turn_query, 1.0, "turn"))
        for i, h in enumerate(self.history):
            if h is None or h.empty or h.end > self.query.begin:
                continue
            out.append(QueryWindow(h, 0.5 ** (i + 1), "history"))
        return tuple(out)

    def pinned(self, *, include_instruction_role: bool = True) -> tuple[Span, ...]:
        """Canonical union of the spans that are kept structurally."""
        groups = [self.required, self.system]
        if include_instruction_role:
            groups.append(self.instruction_role)
        return canonicalize(s for g in groups for s in g)
