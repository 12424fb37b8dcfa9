"""The records of multi-turn views (ALGORITHM.md §6.1): `View`, what the target was served
for one conversation turn (what the store holds and the next turn extends); `ViewDecision`,
one turn's outcome with the labels it carries (`ViewMode`, `Reason`); and `served_result`,
the `Compressed` a serve decision reads out as.

Apart from the decision (`decision.py`) so that the store, the session actor, the injected
parts and the usage report name a view without importing the algorithm that makes one.
Every span and index says its vocabulary (target or drafter tokens), as in `decision.py`.

A view holds digests, not token lists, of the raw prompt and the drafter prefix: a 128K-token
prompt kept as Python ints costs ~5 MB per copy, and a view needs them only to recognise
its own prefix. The served tokens (`view_tokens`) are kept: they are what the next turn
extends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pflash.compress.pipeline import Compressed, Prepared
from pflash.spans import Span
from pflash.views.keys import PrefixHash

Action = Literal["serve", "compress_first"]
# `usage.timings.pflash.view.mode`: the outcome of a turn ("off" = no view involved)
ViewMode = Literal["off", "fresh", "repeat", "continue", "continue-compressed", "rebuild"]

# Why a decision came out as it did (metrics label, trace field, test assertion).
Reason = Literal[
    "views_off",  # chat_view false, legacy selector, raw completion, or no generation prompt
    "generation_prompt_not_suffix",  # the target-encoded generation prompt does not end the prompt
    "no_view",  # nothing stored for this prompt's prefixes
    "view_unusable",  # a stored view that does not prefix this prompt (or another tenant's)
    "options_changed",  # the view was selected under other options (query, required, config)
    "gate_declined",  # the fresh result is the uncompressed prompt: serve it, keep no view
    "repeat",  # the same raw prompt as the view
    "agent_step",  # no new user turn, small delta: appended verbatim, no drafter
    "follow_up",  # a new question with recall off, small delta: appended verbatim
    "recall",  # a new question: the drafter must score it for recall
    "compress_new",  # the new material is at least chat_compress_new_tokens: compress it
    "recall_over_third",  # recalled > 1/3 of the fresh selection: rebuild
    "context_overflow",  # served + max_output > max_context: rebuild
    "served_over_2x_fresh",  # the view is more than twice the fresh compression: rebuild
    "generation_prompt_lost",  # the extended prompt does not end with the generation prompt
]


# --------------------------------------------------------------------------- the view record


@dataclass(frozen=True)
class View:
    """What the target was served for one conversation turn (§6.1 view record).

    - `tenant`: the API key's tenant; a view is never used for another tenant.
    - `conversation`: the conversation key (client session id, or tenant + start-of-chat
      hash); storing a view drops older views of the same conversation.
    - `raw_len`, `raw_digest`: the whole raw prompt (target tokens), for repeat detection.
    - `raw_gen_begin`, `raw_prefix_digest`: target tokens before the generation prompt and
      their digest, the store key (`key`).
    - `drafter_gen_begin`, `drafter_prefix_digest`: drafter tokens before the generation
      prompt and their digest; a new prompt must share that drafter prefix too.
    - `view_tokens`: the served prompt (target tokens); `view_gen_begin`: where its
      generation prompt starts (the snapshot cut, §6.3).
    - `spans`: canonical drafter spans of the raw prompt the view covers (kept or appended),
      valid for any later prompt that shares the drafter prefix.
    - `turn`: 1 for a fresh view, +1 per continue or rebuild.
    - `created` / `used`: wall-clock seconds (time.time()); the store refreshes `used`.
    - `selection`: `keys.selection_digest` of the options the view was selected under
      (pflash_query, pflash_required, the selection-relevant config); a request whose
      options differ is never served this view ("" matches no request).
    """

    tenant: str
    conversation: str
    raw_len: int
    raw_digest: str
    raw_gen_begin: int
    raw_prefix_digest: str
    drafter_gen_begin: int
    drafter_prefix_digest: str
    view_tokens: tuple[int, ...]
    view_gen_begin: int
    spans: tuple[Span, ...]
    turn: int
    created: float
    used: float
    selection: str = ""

    @property
    def key(self) -> PrefixHash:
        return PrefixHash(self.raw_gen_begin, self.raw_prefix_digest)


# --------------------------------------------------------------------------- the decision


@dataclass(frozen=True)
class ViewDecision:
    """The outcome for one turn.

    - `action`: "serve", or "compress_first": the drafter must run (compress_new or recall
      needs a fresh compression, or there is no usable view); call `decide_view` again
      with the result. Nothing else in a compress_first decision is meaningful.
    - `mode`: the `ViewStats.mode`; "off" = no view involved (serve the fresh result as is).
    - `served_ids` / `served_text`: what the target prefills (target tokens / text).
    - `snapshot_cut`: target index of the served view's generation prompt (pass to the
      target as the KV snapshot cut); None in mode "off".
    - `view`: the view to remember, or None (store nothing).
    - `delta_spans` / `recalled_spans`: drafter spans appended / recalled this turn.
    - counts (target tokens, `ViewStats` names): `served_tokens`; `reused_tokens` served
      from the view's cached prefix; `delta_tokens` = served - reused; `recalled_tokens`
      the recall block; `fresh_tokens` the fresh compression (0 when the drafter did not run).
    - `part_begin`: in a compress_first decision for new material (compress_new), the
      drafter token the view's new part starts at: the fresh compression also selects that
      part on its own (`Prepared.part_begin`); 0 otherwise.
    """

    action: Action
    mode: ViewMode
    reason: Reason
    turn: int = 0
    served_ids: tuple[int, ...] = ()
    served_text: str = ""
    snapshot_cut: int | None = None
    view: View | None = None
    delta_spans: tuple[Span, ...] = ()
    recalled_spans: tuple[Span, ...] = ()
    reused_tokens: int = 0
    recalled_tokens: int = 0
    fresh_tokens: int = 0
    part_begin: int = 0

    @property
    def needs_compression(self) -> bool:
        return self.action == "compress_first"

    @property
    def served_tokens(self) -> int:
        return len(self.served_ids)

    @property
    def delta_tokens(self) -> int:
        return len(self.served_ids) - self.reused_tokens

    def view_stats(self) -> dict[str, int | str]:
        """`usage.timings.pflash.view` (api.ViewStats field names)."""
        return {
            "mode": self.mode,
            "turn": self.turn,
            "served_tokens": self.served_tokens,
            "reused_tokens": self.reused_tokens,
            "delta_tokens": self.delta_tokens,
            "recalled_tokens": self.recalled_tokens,
            "fresh_tokens": self.fresh_tokens,
        }


# --------------------------------------------------------------------------- the served result


def served_result(
    decision: ViewDecision, prepared: Prepared, fresh: Compressed | None
) -> Compressed:
    """The `Compressed` the ingress serves and reports for a "serve" decision.

    The fresh result's stats when the drafter ran (its selection is what was measured),
    else the plan's with `compress_ms` 0 (§5.8 step 1: the drafter was skipped);
    `stats["view"]` holds `view_stats()`. The ratio fields come from `Compressed` itself
    (`pipeline.ratio_stats`, served / original target tokens); `budget_ratio` is the fresh
    result's, else this request's r0 (a reused view was selected under the same options,
    `View.selection`).
    """
    if decision.needs_compression:
        raise ValueError("a compress_first decision has nothing to serve")
    raw = prepared.input.prompt.ids
    if fresh is not None:
        stats = dict(fresh.stats)
    else:
        stats = {
            "compress_ms": 0.0,
            "drafter_input_tokens": prepared.plan.n_tokens,
            "kept_tokens": prepared.budget.kept_tokens if prepared.budget else 0,
            "query_rule": prepared.plan.query_rule,
            "stop_reason": "view",
        }
    stats["compressed_tokens"] = len(decision.served_ids)
    stats["view"] = decision.view_stats()
    return Compressed(
        compressed=tuple(decision.served_ids) != tuple(raw),
        served_ids=tuple(decision.served_ids),
        served_text=decision.served_text,
        kept_spans=fresh.kept_spans if fresh is not None else (),
        candidate_lifts=fresh.candidate_lifts if fresh is not None else (),
        stats=stats,
        plan=prepared.plan,
        reason=fresh.reason if fresh is not None else decision.reason,
        original_tokens=len(raw),
        budget_ratio=_budget_ratio(prepared, fresh),
    )


def _budget_ratio(prepared: Prepared, fresh: Compressed | None) -> float | None:
    if fresh is not None:
        return fresh.budget_ratio
    return prepared.budget.r0 if prepared.budget is not None else None
