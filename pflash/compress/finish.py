"""The second half of one request, `finish(prepared, scores)`: given the scorer's per-token
scores, mix in the passage evidence, cut the candidates (segments, lexical units, passages,
or a uniform sample for a question about the whole document), keep the lexical evidence
first, select within the budget, assemble the served prompt and retry at lower keep ratios
until it fits the ceiling; then the stats, the selection trace and, when a view will append
the prompt's last part, that part selected on its own. The legacy (v1) selector's second
half is here too.

The first half (`prepare`) and the records both halves read (`Prepared`, `Compressed`) are
in pipeline.py, which does not import this module. Fails closed: a scorer, selection or
ceiling failure raises `CompressionFailed` naming the stage.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from pflash.compress.assemble import Assembly, assemble, fit_ceiling
from pflash.compress.evidence import passage_evidence
from pflash.compress.evidence.lexical import LexicalEvidence, LexicalParams, find_lexical_evidence
from pflash.compress.evidence.position_prior import lift_over_prior
from pflash.compress.evidence.stratified import stratified_selection
from pflash.compress.pipeline import Compressed, Prepared, ms_since
from pflash.compress.plan.budget import configured_keep_ratio
from pflash.compress.plan.segments import ProbeParams, segment
from pflash.compress.scoring import ScoreResult, candidate_lifts
from pflash.compress.selection import (
    Candidates,
    LegacyParams,
    SelectionResult,
    build_candidates,
    kept_spans,
    promote_spans,
    ranked_candidates,
    resolve_score_kind,
    select_candidates,
    select_legacy,
    select_split,
    span_sums,
    split_candidates,
)
from pflash.compress.text import encoding
from pflash.compress.turn_memo import TurnMemo
from pflash.config import CompressionPart, SelectionConfig
from pflash.errors import CompressionFailed
from pflash.spans import Span, SpanIndex, decode_ids
from pflash.trace import SelectionTrace, TraceWriter

# a code block is lifted whole (`code_blocks.lift_blocks`) when it takes at most this share of
# the droppable budget: a described function is kept with room for the rest of the evidence
WHOLE_BLOCK_SHARE = 0.5


@dataclass(frozen=True)
class _Attempt:
    """One selection + assembly at a keep ratio (what the ceiling loop retries).

    `candidates`: what was selected from, with lexical promotions marked mandatory;
    `lexical_kept`: lexical spans promoted at this budget (0 with lexical evidence off)."""

    assembly: Assembly
    selection: SelectionResult
    token_budget: int
    candidates: Candidates
    lexical_kept: int = 0

    @property
    def ceiling_tokens(self) -> int:
        return self.assembly.ceiling_tokens

    @property
    def n_target_tokens(self) -> int:
        return self.assembly.n_target_tokens


def finish(
    prepared: Prepared,
    scores: ScoreResult,
    *,
    config: CompressionPart,
    target_tokenizer,
    drafter_tokenizer,
    boundary: np.ndarray | None = None,
    subunit: np.ndarray | None = None,
    probe_params: ProbeParams | None = None,
    trace: TraceWriter | None = None,
    memo: TurnMemo | None = None,
) -> Compressed:
    """Select, assemble and fit the ceiling, given the scorer's per-token scores. `memo`:
    the conversations' lexical units from earlier turns (`TurnMemo`, keyed by the input's
    `session_key`); what is selected is the same without it."""
    select_started = time.perf_counter()
    if not prepared.compress or prepared.score_request is None:
        raise ValueError("finish() needs a prepared request that compresses")
    if not config.selection.strict:
        return _finish_legacy(prepared, scores, config, target_tokenizer, drafter_tokenizer, trace)
    plan, budget = prepared.plan, prepared.budget
    assert budget is not None
    n = plan.n_tokens
    token_scores = _head_scores(scores, config.selection, n)
    if config.select_position_prior == "distance" and config.select_scorer != "legacy":
        token_scores = lift_over_prior(token_scores, plan.query.begin)
    signals = passage_evidence.passage_signals(
        prepared.score_request,
        scores,
        config.selection,
        plan.drafter,
        whole_block_tokens=math.floor(WHOLE_BLOCK_SHARE * (budget.budget - budget.kept_tokens)),
    )
    if signals:
        token_scores = passage_evidence.mix_evidence(
            token_scores, signals, context_end=plan.query.begin
        )
    suffix = prepared.score_request.suffix_candidates
    seg = segment(
        n,
        mode=config.select_segments,
        chunk_size=budget.chunk_size,
        query=plan.query,
        pinned=budget.pinned,
        suffix_candidates=suffix,
        boundary=boundary,
        subunit=subunit,
        params=probe_params,
    )
    kind = resolve_score_kind(config.select_score, seg.kind, config.select_scorer)
    cands = build_candidates(
        seg,
        token_scores,
        query=plan.query,
        pinned=budget.pinned,
        suffix_candidates=suffix,
        kind=kind,
    )
    evidence = None
    if config.select_lexical != "off":
        evidence = find_lexical_evidence(
            plan,
            pinned=budget.pinned,
            params=LexicalParams.from_config(config, cap_tokens=10 * budget.budget),
            pflash_query=prepared.input.pflash_query,
            previous=memo.get(prepared.input.session_key, "units") if memo is not None else None,
        )
        if memo is not None and evidence.prefix is not None:
            memo.put(
                prepared.input.session_key, "units", evidence.prefix, len(evidence.prefix.text)
            )
        cands = split_candidates(cands, evidence.cut_points(), token_scores, kind=kind)
    if signals and config.select_passage_cuts:  # a passage's tokens share its score: by density
        kind = "density"
        cands = passage_evidence.cut_at_passages(cands, signals, token_scores)
    if prepared.question is not None:  # about the whole document: a uniform sample (§4.11)
        cands, evidence = stratified_selection(
            plan,
            pinned=budget.pinned,
            suffix_candidates=suffix,
            evidence=evidence,
            question=prepared.question,
        )
    other = _legacy_candidate_scores(scores, cands) if config.select_scorer == "split" else None

    def attempt(r: float) -> _Attempt:
        token_budget = math.floor(n * float(np.float32(r)))
        if token_budget <= 0:
            raise CompressionFailed(
                "selection", f"keep ratio {r:.4g} leaves no budget over {n} drafter tokens"
            )
        share = config.lexical_max_share
        pool, promoted = _promote(cands, evidence, token_budget, share, bool(signals))
        sel = _select(
            pool, other, token_budget, config.selection, skip_oversized=seg.kind == "probe"
        )
        if not sel.ok:
            raise CompressionFailed(
                "selection",
                f"{sel.stop_reason}: {sel.error or 'no selection'} (budget {token_budget})",
            )
        spans = kept_spans(pool, sel.ordinals)
        asm = assemble(
            drafter_tokenizer,
            target_tokenizer,
            plan.drafter.ids,
            spans,
            paragraph_join=config.select_paragraph_join,
            prompt=plan.drafter,
        )
        return _Attempt(asm, sel, token_budget, pool, promoted)

    max_ctx = prepared.input.max_context
    limit = max_ctx - max(1, prepared.input.max_output) if max_ctx and max_ctx > 0 else None
    fit = fit_ceiling(attempt, budget.keep_ratio, budget.ceiling, limit=limit)
    chosen: _Attempt = fit.assembly
    spans = cands.spans() if signals and config.select_passage_cuts else seg.spans()  # §3.5
    lifts = tuple(candidate_lifts(scores.mass, spans)) if scores.mass is not None else ()
    stats = _stats(prepared, scores, chosen, len(cands), budget.kept_tokens, select_started)
    lexical_spans: tuple[Span, ...] = ()
    named_spans: tuple[Span, ...] = ()
    stats |= passage_evidence.evidence_stats(scores)
    stats["question_kind"] = prepared.question.kind if prepared.question else None
    if evidence is not None:
        stats["lexical_units"] = len(evidence.units)
        stats["lexical_kept"] = chosen.lexical_kept
        stats["lexical_units_reused"] = evidence.prefix.reused if evidence.prefix else 0
        kept = SpanIndex(chosen.assembly.kept_spans)
        units = [u for u in evidence.units if kept.covers(u.span)]
        lexical_spans = tuple(u.span for u in units)
        named_spans = tuple(u.span for u in units if u.named)
    if trace is not None:
        trace.write(
            _selection_trace(prepared, config.selection, seg, other, chosen, fit.r_used, kind)
        )
    part_spans: tuple[Span, ...] = ()
    if prepared.part_begin > 0:
        part_spans = _select_part(
            cands,
            other,
            evidence,
            prepared.part_begin,
            budget.r0,
            config,
            named_only=bool(signals),
            skip_oversized=seg.kind == "probe",
        )
    return Compressed(
        compressed=True,
        served_ids=tuple(chosen.assembly.target_ids),
        served_text=chosen.assembly.text,
        kept_spans=chosen.assembly.kept_spans,
        candidate_lifts=lifts,
        stats=stats,
        plan=plan,
        reason=prepared.reason,
        original_tokens=len(prepared.input.prompt.ids),
        lexical_spans=lexical_spans,
        evidence_spans=passage_evidence.recalled_evidence(signals, chosen.assembly.kept_spans),
        named_spans=named_spans,
        ranked_spans=ranked_candidates(chosen.candidates, chosen.selection.ordinals, token_scores),
        budget_ratio=budget.r0,
        part_spans=part_spans,
        part_begin=prepared.part_begin if part_spans else 0,
    )


def _select_part(
    cands: Candidates,
    other: np.ndarray | None,
    evidence: LexicalEvidence | None,
    begin: int,
    r0: float,
    config: CompressionPart,
    *,
    named_only: bool,
    skip_oversized: bool,
) -> tuple[Span, ...]:
    """The part of the prompt from drafter token `begin` on, selected on its own: its
    candidates (one straddling `begin` cut there), the same scores and lexical promotion,
    and a budget of its mandatory tokens plus r0 of the rest.

    Why: a view appends this part (a tool output, a paste) to what it already serves. Taking
    the part's share of a whole-prompt selection left a long tool output almost nothing (the
    whole budget went to earlier text the view already holds, or had dropped), so an agent's
    view lost each new output; selected on its own, each part is kept at the keep ratio,
    and the view grows by r0 of what the conversation adds.
    """
    keep = cands.end > begin
    part = cands.replace(
        begin=np.maximum(cands.begin[keep], begin),
        end=cands.end[keep],
        score=cands.score[keep],
        mandatory=cands.mandatory[keep],
        ordinal=cands.ordinal[keep],
    )
    if not len(part):
        return ()
    mandatory = int(part.lengths[part.mandatory].sum())
    budget = mandatory + math.floor(r0 * (int(part.lengths.sum()) - mandatory))
    if budget <= 0:
        return ()
    pool, _ = _promote(part, evidence, budget, config.lexical_max_share, named_only)
    sel = _select(
        pool,
        None if other is None else other[keep],
        budget,
        config.selection,
        skip_oversized=skip_oversized,
    )
    if not sel.ok:
        raise CompressionFailed(
            "selection", f"new part: {sel.stop_reason}: {sel.error or 'no selection'}"
        )
    return kept_spans(pool, sel.ordinals)


def _head_scores(scores: ScoreResult, config: SelectionConfig, n: int) -> np.ndarray:
    """The per-token scores the candidates are ranked by; fail closed on a bad scorer reply."""
    arr = scores.legacy if config.select_scorer == "legacy" else scores.mass
    if arr is None:
        raise CompressionFailed("drafter", f"scorer {config.select_scorer!r} returned no scores")
    arr = np.asarray(arr)
    if arr.shape != (n,):
        raise CompressionFailed(
            "drafter", f"scorer returned {arr.shape} scores for {n} drafter tokens"
        )
    if not np.all(np.isfinite(arr)):
        raise CompressionFailed("drafter", "non-finite scores")
    return arr


def _legacy_candidate_scores(scores: ScoreResult, cands: Candidates) -> np.ndarray:
    if scores.legacy is None:
        raise CompressionFailed("drafter", "split scorer returned no legacy scores")
    return span_sums(scores.legacy, cands.begin, cands.end) / cands.lengths


def _promote(
    cands: Candidates, evidence: LexicalEvidence | None, budget: int, share: float, named_only: bool
) -> tuple[Candidates, int]:
    """The candidates with the lexical evidence that fits this budget made mandatory: the
    question sentences first, then the anchored units best first (only those the question
    names when passage evidence is mixed in: `LexicalEvidence.promotion_order`), within
    `share` of the droppable budget; the scores fill the rest. Run per ceiling attempt."""
    if evidence is None:
        return cands, 0
    order = evidence.promotion_order(named_only=named_only)
    return promote_spans(cands, order, budget=budget, share=share)


def _select(
    cands: Candidates,
    other: np.ndarray | None,
    budget: int,
    config: SelectionConfig,
    *,
    skip_oversized: bool,
) -> SelectionResult:
    if other is not None:
        return select_split(
            cands,
            other,
            budget=budget,
            fraction=config.select_split,
            mode=config.select_mode,
            top_p=config.select_top_p,
            skip_oversized=skip_oversized,
        )
    return select_candidates(
        cands,
        budget=budget,
        mode=config.select_mode,
        top_p=config.select_top_p,
        top_k=config.select_topk,
        skip_oversized=skip_oversized,
    )


def _stats(
    prepared: Prepared,
    scores: ScoreResult,
    chosen: _Attempt,
    n_segments: int,
    kept: int,
    select_started: float,
) -> dict[str, Any]:
    plan = prepared.plan
    history = sum(1 for w in plan.windows() if w.kind == "history")
    now = time.perf_counter()
    return {
        "compress_ms": ms_since(prepared.started, now),
        "plan_ms": prepared.plan_ms,
        "select_ms": ms_since(select_started, now),
        "drafter_input_tokens": plan.n_tokens,
        "kept_tokens": kept,
        "compressed_tokens": len(chosen.assembly.target_ids),
        "query_rule": plan.query_rule,
        "history_queries": history,
        "segments": n_segments,
        "stop_reason": chosen.selection.stop_reason,
        "scorer_resume": scores.scorer_resume,
        "scorer_new_tokens": scores.scorer_new_tokens,
        "scorer_forward_ms": round(scores.scorer_forward_ms, 1),
    }


def _selection_trace(
    prepared, config: SelectionConfig, seg, other, chosen: _Attempt, r, kind
) -> SelectionTrace:
    plan = prepared.plan
    cands = chosen.candidates
    ordinals = set(chosen.selection.ordinals)
    return SelectionTrace(
        schema_version=3,
        input_tokens=plan.n_tokens,
        keep_ratio=float(np.float32(r)),
        input_ids=list(plan.drafter.ids),
        query_begin=plan.query.begin,
        query_end=plan.query.end,
        selector_mode=config.select_mode,
        query_parser=config.select_query_parser,
        token_budget=chosen.token_budget,
        top_k=config.select_topk,
        retained_tokens=chosen.selection.retained_tokens,
        required_instruction_spans=prepared.budget.pinned,
        stop_reason=chosen.selection.stop_reason,
        retained_mass=chosen.selection.retained_mass,
        segmentation=seg.kind,
        candidate_score=kind,
        scorer=config.select_scorer,
        split_fraction=config.select_split if config.select_scorer == "split" else 0.0,
        other_chunk_scores=() if other is None else tuple(float(x) for x in other.tolist()),
        segments=cands.spans(),
        chunk_size=seg.chunk_size,
        n_lookahead=len(plan.query),
        pool_kernel=1,
        n_keep=len(ordinals),
        chunk_scores=[float(x) for x in cands.score.tolist()],
        selected_chunks=sorted(int(o) for o in ordinals),
        forced_chunks=[bool(x) for x in cands.mandatory.tolist()],
        compressed_ids=[
            t for s in chosen.assembly.kept_spans for t in plan.drafter.ids[s.begin : s.end]
        ],
    )


def _finish_legacy(
    prepared, scores, config, target_tokenizer, drafter_tokenizer, trace
) -> Compressed:
    """Legacy selector: chunk means of the smoothed tail scores, head/tail + anchors (§4.1)."""
    plan = prepared.plan
    n = plan.n_tokens
    if scores.legacy is None or np.asarray(scores.legacy).shape != (n,):
        raise CompressionFailed("drafter", "legacy scorer returned no per-token scores")
    r0 = configured_keep_ratio(config.gate, len(prepared.input.prompt.ids))
    sel = select_legacy(
        np.asarray(plan.drafter.ids),
        np.asarray(scores.legacy),
        r0,
        LegacyParams.from_config(config, repeat_rule=bool(config.legacy_repeat_rule)),
    )
    asm = assemble(
        drafter_tokenizer,
        target_tokenizer,
        plan.drafter.ids,
        sel.kept,
        paragraph_join=config.select_paragraph_join,
        prompt=plan.drafter,
    )
    text, ids = asm.text, list(asm.target_ids)
    # Query survival (§4.8): the question must reach the target even if its chunks were dropped.
    turn = plan.turn_query or plan.query_span
    user_text = decode_ids(drafter_tokenizer, plan.drafter.ids[turn.begin : turn.end]).strip()
    kept_ids = [t for s in sel.kept for t in plan.drafter.ids[s.begin : s.end]]
    if user_text and not _subsequence_survives(
        kept_ids, list(plan.drafter.ids[turn.begin : turn.end])
    ):
        text = text + "\n" + user_text
        ids = list(encoding.encode(target_tokenizer, text, asm.controls))
    stats = {
        "compress_ms": ms_since(prepared.started),
        "drafter_input_tokens": n,
        "kept_tokens": 0,
        "compressed_tokens": len(ids),
        "query_rule": plan.query_rule,
        "history_queries": 0,
        "segments": sel.n_chunks,
        "stop_reason": "legacy",
        "scorer_resume": scores.scorer_resume,
        "scorer_new_tokens": scores.scorer_new_tokens,
        "scorer_forward_ms": round(scores.scorer_forward_ms, 1),
    }
    del trace
    return Compressed(
        True,
        tuple(ids),
        text,
        sel.kept,
        (),
        stats,
        plan,
        prepared.reason,
        len(prepared.input.prompt.ids),
        budget_ratio=r0,
    )


def _subsequence_survives(kept: list[int], query: list[int], min_fraction: float = 0.8) -> bool:
    """Greedy backwards subsequence match of the query in the kept ids (§4.8 legacy rule)."""
    if not query or len(query) >= 1000:
        return True
    qi, matched = len(query) - 1, 0
    for tok in reversed(kept):
        if qi < 0:
            break
        if tok == query[qi]:
            matched += 1
            qi -= 1
    return matched >= min_fraction * len(query)
