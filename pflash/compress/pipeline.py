"""One request end to end: plan → budget → score → segments → select → assemble → stats.

Selection keeps the lexical evidence first (lexical.py), then fills the budget by attention
mixed with passage evidence (passage_evidence.py). Two pure halves around the drafter call,
which `pflash/flow/compressor.py` (the one flow every caller uses) awaits between them:

    prepare(inp, ...)          plan, budget, gate, the ScoreRequest (here)
    finish(prepared, scores)   select, assemble, ceiling retries (finish.py)

Here: the first half, the records the halves and their caller hand each other
(`CompressionRequest`, `Prepared`, `Compressed` and the ratio stats every path reports through
`Compressed`), the results that serve the prompt as sent (`passthrough`, `uncompressed`)
and what a failed stage leads to (`scorer_failure_action`). finish.py reads the records
from here; nothing here imports it.

Everything fails closed: a plan, scorer, selection or ceiling failure raises
`CompressionFailed` naming the stage; nothing here silently serves the original prompt.
Serving uncompressed is an explicit outcome (`Prepared.compress` False with a reason).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from pflash.compress.evidence import passage_evidence
from pflash.compress.evidence.aggregate import AggregateQuestion, asked_text, classify_question
from pflash.compress.plan.budget import BudgetPlan, plan_budget_for
from pflash.compress.plan.query import Plan, plan_prompt
from pflash.compress.render.rendered import RenderedPrompt
from pflash.compress.scoring import ScoreRequest
from pflash.compress.text import encoding
from pflash.compress.turn_memo import TurnMemo
from pflash.config import CompressionPart, PFlashConfig, ServerConfig
from pflash.spans import Span


@dataclass(frozen=True)
class CompressionRequest:
    """One request from admission to the drafter call: the prompt as rendered
    (`RenderedPrompt`: its **target** tokens, exactly what the target would prefill, and for
    a chat the inputs that rendered them, so pins can be found by re-rendering, and the
    encoding the render made, which planning reuses), what the request asks of its
    compression, and what the flow learns before planning it.

    - `config`: the server config with this request's allowed overrides applied; the flow
      (`Compressor`) reads it, the stages are handed their settings, so a request planned
      without the flow may leave it None;
    - `tenant`: whose state (views) this request may see; `conversation`: its affinity key
      (also the drafter/target session id, `session_key`); `session_id`: the client's own
      session id (the adaptive keep ratio follows only client-named sessions);
    - `pflash_query`, `pflash_required`: the request's explicit question and required strings;
    - `max_output`: max_tokens (target tokens; 0 when unset);
    - `keep_text`: the caller needs the served text even when nothing is compressed
      (pflash_return_prompt), so mode off decodes it;
    - `keep_ratio`: the request's own `pflash_keep_ratio` (already applied to `config`), or
      None. A request that names its ratio gets it: the adaptive controller moves only the
      server's ratio, never one the request set;
    - `max_context`, `r0`: the target's context (target tokens) and the keep ratio the
      budget starts from (configured, or the adaptive controller's for this session), filled
      in by the flow (`replace`) before `prepare` reads them; None: no context to fit, and
      the configured ratio.
    """

    prompt: RenderedPrompt
    config: PFlashConfig | None = None
    tenant: str = "anonymous"
    conversation: str = ""
    session_id: str | None = None
    pflash_query: str | None = None
    pflash_required: tuple[str, ...] = ()
    max_output: int = 0
    keep_text: bool = False
    keep_ratio: float | None = None
    max_context: int | None = None
    r0: float | None = None

    @property
    def session_key(self) -> str | None:
        """The drafter session and turn memo key: the conversation key (none: no session)."""
        return self.conversation or None


@dataclass(frozen=True)
class Prepared:
    """The pure first half: the plan, the budget, and what to ask the scorer.

    `compress` False means serve the original prompt (mode off, or auto below threshold);
    `reason` says why. `score_request` is None exactly then.
    """

    input: CompressionRequest
    prompt_text: str
    plan: Plan
    budget: BudgetPlan | None
    compress: bool
    reason: str
    score_request: ScoreRequest | None
    started: float = field(default_factory=time.perf_counter)
    plan_ms: float = 0.0  # time in prepare(): planning, pinned spans, mapping, budget
    # drafter tokens: > 0 when a view will append the part from here on; finish() then also
    # selects that part on its own (`Compressed.part_spans`, ALGORITHM.md §6.1 step 9)
    part_begin: int = 0
    # a question about the whole document (aggregate.py): auto serves it whole, always
    # selects a uniform sample of the document's units
    question: AggregateQuestion | None = None


@dataclass(frozen=True)
class Compressed:
    """What the target is served.

    - `served_ids` (target tokens) and `served_text`: the compressed prompt, or the original
      when `compressed` is False.
    - `kept_spans`: drafter spans kept; `candidate_lifts`: (span, lift) per candidate for
      recall (head scorer only; empty otherwise).
    - `stats`: `usage.timings.pflash` fields (names as in the API contract); the ratio
      fields (`served_ratio`, its alias `keep_ratio`, `budget_ratio`) are written here, on
      construction, from the fields below (`ratio_stats`): whichever path built the result,
      they measure the same thing.
    - `lexical_spans`: kept units that share rare words with the question (lexical
      evidence); `evidence_spans`: the kept parts of the passages the evidence signals
      (semantic, projection) rank best for it; recall brings both back like
      high-lift candidates. `named_spans`: the lexical spans whose shared text the question
      names (an identifier, a number, a name, a quoted string: `AnchoredUnit.named`); when
      there are any, recall leaves out the high-lift candidates (§6.2). `ranked_spans`: the
      kept candidates, best first by their mean selection score (attention mixed with the
      passage signals), which a question in other words recalls from (§6.2).
    - `budget_ratio`: r0, the keep ratio over droppable tokens the budget was sized with
      (configured, curve, adaptive or the request's `pflash_keep_ratio`, after the cap that
      fits an over-long prompt into the context; before pins are added and before the
      ceiling's retries); None when the original prompt is served.
    - `part_spans`: with `Prepared.part_begin` > 0, the drafter spans kept when the part
      from there on is selected on its own at r0 (what a view appends, §6.1 step 9), and
      `part_begin` that drafter token; empty and 0 otherwise.
    - `snapshot_cut`: where the target's KV snapshot may be cut (target tokens: the
      generation-prompt start, so the next turn extends the snapshot); set by the flow
      (`Compressor`) once it knows what is served, None where no cut is known.
    """

    compressed: bool
    served_ids: tuple[int, ...]
    served_text: str
    kept_spans: tuple[Span, ...]
    candidate_lifts: tuple[tuple[Span, float], ...]
    stats: dict[str, Any]
    plan: Plan | None = None
    reason: str = ""
    original_tokens: int = 0  # target tokens of the prompt as the client sent it
    lexical_spans: tuple[Span, ...] = ()
    evidence_spans: tuple[Span, ...] = ()
    named_spans: tuple[Span, ...] = ()
    ranked_spans: tuple[Span, ...] = ()
    budget_ratio: float | None = None
    part_spans: tuple[Span, ...] = ()
    part_begin: int = 0
    snapshot_cut: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stats", {**self.stats, **ratio_stats(self)})

    @property
    def served_ratio(self) -> float:
        """Served target tokens / original target tokens (1.0 for an empty prompt)."""
        if self.original_tokens <= 0:
            return 1.0
        return len(self.served_ids) / self.original_tokens


def ms_since(t0: float, now: float | None = None) -> float:
    """Milliseconds from `t0` (a `time.perf_counter()`) to now, to 0.1 ms: every stage
    time in the stats is read this way."""
    return round(((time.perf_counter() if now is None else now) - t0) * 1000.0, 1)


def ratio_stats(result: Compressed) -> dict[str, float | None]:
    """The ratio fields of `usage.timings.pflash`, computed once for every path (fresh,
    view, legacy, gate declined, mode off): `served_ratio` = served / original target
    tokens, `keep_ratio` its alias (the field's name before the split, so a client reading
    it gets one meaning everywhere), `budget_ratio` the r0 the budget applied (None when
    the prompt was served as sent)."""
    served = result.served_ratio
    budget = result.budget_ratio if result.compressed else None
    return {"served_ratio": served, "keep_ratio": served, "budget_ratio": budget}


# ---------------------------------------------------------------------------- first half


def prepare(
    inp: CompressionRequest,
    *,
    config: CompressionPart,
    target_tokenizer,
    drafter_tokenizer,
    memo: TurnMemo | None = None,
) -> Prepared:
    """Plan queries and pins, size the budget, and decide whether to compress at all.
    `memo`: what the conversation's earlier turn derived (`TurnMemo`, by the input's
    `session_key`); the result is the same without it."""
    started = time.perf_counter()
    prepared = _prepare(
        inp,
        config=config,
        target_tokenizer=target_tokenizer,
        drafter_tokenizer=drafter_tokenizer,
        memo=memo,
    )
    return replace(prepared, plan_ms=ms_since(started))


def _prepare(
    inp: CompressionRequest,
    *,
    config: CompressionPart,
    target_tokenizer,
    drafter_tokenizer,
    memo: TurnMemo | None = None,
) -> Prepared:
    prompt = inp.prompt
    decoded = encoding.decode(target_tokenizer, prompt.ids, prompt.text)
    prompt_text = decoded.text
    plan = plan_prompt(
        prompt_text=prompt_text,
        controls=decoded.controls,
        rendered=prompt.encoding,
        drafter_tokenizer=drafter_tokenizer,
        target_tokenizer=target_tokenizer,
        config=config.selection,
        messages=prompt.messages,
        tools=prompt.tools,
        chat_template_kwargs=prompt.template_kwargs,
        pflash_query=inp.pflash_query,
        pflash_required=inp.pflash_required,
    )
    prompt_tokens = len(inp.prompt.ids)
    if not config.selection.strict:
        return _prepare_legacy(inp, prompt_text, plan, config)
    question = classify_question(asked_text(plan, inp.pflash_query))
    budget = plan_budget_for(
        plan,
        config,
        prompt_tokens=prompt_tokens,
        max_ctx=inp.max_context,
        max_output=inp.max_output,
        r0=inp.r0,
        aggregate=question is not None,
    )
    if not budget.compress:
        return Prepared(
            inp, prompt_text, plan, budget, False, budget.reason, None, question=question
        )
    if plan.n_tokens < len(plan.query) + 1 or (
        plan.query.begin == 0 and not plan.query_suffix_candidates
    ):
        # nothing precedes the question: the scorer would have no key to score
        return Prepared(
            inp, prompt_text, plan, budget, False, "prompt_too_short", None, question=question
        )
    if budget.keep_ratio >= 1.0:
        return Prepared(
            inp, prompt_text, plan, budget, False, "nothing_to_drop", None, question=question
        )
    suffix = plan.query_suffix_candidates and config.select_scorer != "split"
    request = ScoreRequest(
        ids=plan.drafter.ids,
        windows=plan.windows(),
        query=plan.query,
        suffix_candidates=suffix,
        scorer=config.select_scorer,
        session_key=inp.session_key,
        want_tap=config.segment_probe_gguf is not None and config.select_segments != "fixed",
        **passage_evidence.evidence_request(
            plan,
            budget.pinned,
            config.selection,
            suffix=suffix,
            memo=memo,
            conversation=inp.session_key,
        ),
    )
    return Prepared(inp, prompt_text, plan, budget, True, budget.reason, request, question=question)


def _prepare_legacy(
    inp: CompressionRequest, prompt_text: str, plan: Plan, config: CompressionPart
) -> Prepared:
    """Legacy (v1) path: gate on the prompt length alone, tail scorer over the query rows."""
    prompt_tokens = len(inp.prompt.ids)
    if config.mode == "off":
        return Prepared(inp, prompt_text, plan, None, False, "mode_off", None)
    if config.mode == "auto" and prompt_tokens < config.threshold:
        return Prepared(inp, prompt_text, plan, None, False, "prompt_below_threshold", None)
    n = plan.n_tokens
    rows = min(config.legacy_query_tokens, max(0, n - 1))
    if rows <= 0:
        return Prepared(inp, prompt_text, plan, None, False, "prompt_too_short", None)
    query = Span(n - rows, n)
    request = ScoreRequest(
        ids=plan.drafter.ids, windows=(), query=query, scorer="legacy", session_key=inp.session_key
    )
    return Prepared(
        inp,
        prompt_text,
        plan,
        None,
        True,
        "always" if config.mode == "always" else "prompt_at_least_threshold",
        request,
    )


# ---------------------------------------------------------------------------- failures


def scorer_failure_action(stage: str, config: ServerConfig) -> str:
    """What to do when compression fails at `stage`: "bypass" (serve the prompt uncompressed,
    counted) only for a failure of the scoring pass (the drafter, or the segment probe that
    reads its tap) and only when the operator chose `on_drafter_error: bypass`; "fail"
    otherwise. Mapping, selection and ceiling failures always fail: serving a wrongly
    compressed prompt is never an option, and an uncompressed one only by that explicit
    choice."""
    scoring = stage in ("drafter", "probe")
    return "bypass" if scoring and config.on_drafter_error == "bypass" else "fail"


# ---------------------------------------------------------------------------- one call


def passthrough(prompt_ids: tuple[int, ...], prompt_text: str) -> Compressed:
    """pflash_mode off: serve the prompt as sent, without planning it (`prompt_text` may be
    "" when nobody reads it)."""
    stats = {"compressed_tokens": len(prompt_ids), "stop_reason": "mode_off"}
    return Compressed(
        False, tuple(prompt_ids), prompt_text, (), (), stats, None, "mode_off", len(prompt_ids)
    )


def uncompressed(prepared: Prepared) -> Compressed:
    """The original prompt, for a request the gate chose not to compress."""
    ids = prepared.input.prompt.ids
    stats = {
        "compress_ms": ms_since(prepared.started),
        "drafter_input_tokens": prepared.plan.n_tokens,
        "kept_tokens": prepared.budget.kept_tokens if prepared.budget else 0,
        "compressed_tokens": len(ids),
        "query_rule": prepared.plan.query_rule,
        "stop_reason": prepared.reason,
        "question_kind": prepared.question.kind if prepared.question else None,
    }
    return Compressed(
        False,
        tuple(ids),
        prepared.prompt_text,
        (),
        (),
        stats,
        prepared.plan,
        prepared.reason,
        len(ids),
    )
