"""The per-turn view decision of a multi-turn chat: fresh | repeat | continue |
continue-compressed | rebuild (ALGORITHM.md §6.1-§6.3).

Why views: the target keeps a KV snapshot of everything before the generation prompt of the
prompt it was last served (`snapshot_cut`, §6.3). If the next turn's served prompt starts
with exactly those tokens, the target prefills only the new part. A view remembers that
served prompt, so a later turn can append to it (verbatim, or compressed when the new part
is large), recall dropped material the new question attends to, or rebuild from a fresh
compression when the view has drifted too far from what a fresh compression would keep.

Vocabularies (every span and index says which):
- **target tokens**: `raw_ids` (the prompt as the client sent it, chat template applied),
  `View.raw_gen_begin`, `View.view_tokens` / `view_gen_begin` (the served prompt), the
  store keys (`PrefixHash`) and every `ViewStats` count;
- **drafter tokens**: `Plan.drafter.ids` (the drafter's encoding of the prompt text), turn
  indices, `View.drafter_gen_begin`, `View.spans`, the delta and recalled spans.

Everything here is pure: tokenizers are only read, nothing is stored. The compressor
(`pflash/flow/compressor.py`) asks `decide_view` first without a fresh compression; when the
answer is "compress first" it runs the drafter and asks again with the result.

The decision's steps (§6.1 steps 1-15, recall §6.2) read top-down in this one module, which
is how the algorithm is checked against docs/ALGORITHM.md; the records it reads and returns
(`View`, `ViewDecision`, `served_result`) live in `records.py`, the store keys in `keys.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from pflash.compress.assemble import joined_runs, recall_text
from pflash.compress.evidence.words import is_question_like, split_units, words
from pflash.compress.pipeline import Compressed, Prepared
from pflash.compress.plan.query import Plan
from pflash.compress.render.chat import FAMILIES, ChatLayout, Turn, resolve_marker
from pflash.compress.text import encoding
from pflash.config import ViewPart
from pflash.spans import (
    Span,
    SpanIndex,
    Tokenizer,
    canonicalize,
    decode_ids,
    subtract,
    total_tokens,
    union,
)
from pflash.views.keys import selection_digest, token_digest
from pflash.views.records import Reason, View, ViewDecision, ViewMode

# --------------------------------------------------------------------------- the decision


@dataclass(frozen=True)
class _Prompt:
    """The new prompt's facts the decision needs, both vocabularies."""

    raw: tuple[int, ...]  # target tokens
    gen_ids: tuple[int, ...]  # the generation prompt, target tokens (a suffix of raw)
    raw_gen_begin: int  # target tokens
    plan: Plan
    drafter_gen_begin: int  # drafter tokens
    selection: str  # keys.selection_digest of this request's options

    @property
    def n_drafter(self) -> int:
        return self.plan.n_tokens


def decide_view(
    prepared: Prepared,
    view: View | None,
    fresh: Compressed | None,
    *,
    tenant: str,
    conversation: str,
    config: ViewPart,
    target_tokenizer: Tokenizer,
    drafter_tokenizer: Tokenizer,
    now: float,
) -> ViewDecision:
    """The §6.1 view algorithm for one turn, as a pure function.

    - `prepared`: `pipeline.prepare` of this prompt (plan in drafter tokens, raw target
      ids, max_output / max_context in target tokens).
    - `view`: what `ViewStore.lookup(tenant, view_keys(prepared, target))` returned.
    - `fresh`: None on the first call; on the second call (after "compress_first") the
      fresh compression (`finish.finish`, or `pipeline.uncompressed` when the gate
      declined).

    Outcomes, in order:
    1. views off (config.chat_view false, legacy selector, not a chat with a generation
       prompt, or the target-encoded generation prompt is not a suffix of the prompt) →
       serve the fresh compression, mode "off" (compress first when there is none);
    2. the tenant's view of this prompt (the same raw prompt, or a usable prefix) selected
       under other options (`View.selection`: pflash_query, pflash_required, keep ratio,
       mode, scorer config) → rebuild from a fresh compression, reason "options_changed";
       the same raw prompt as the view → repeat: the stored served prompt, byte-identical,
       unless it no longer fits with this request's max_output (→ rebuild, as in 6);
    3. no usable view (none, another tenant's, or not a prefix in both vocabularies) →
       fresh: the fresh compression becomes a turn-1 view (compress first without one);
    4. compress_new (new target tokens ≥ chat_compress_new_tokens) or recall (a new user
       question and chat_recall) without a fresh result → compress first; an agent step or
       a small follow-up with recall off is appended verbatim **without the drafter**;
    5. recall (§6.2, `recall_spans`): what the fresh selection found for the new question
       (its named evidence; for a question that names nothing, the best of what it kept,
       within a third of it; for a turn that asks nothing, lifts ≥ chat_recall_min_lift)
       minus what the view covers;
       3 × recalled > the fresh selection (drafter tokens) → rebuild;
    6. served = view_tokens[:view_gen_begin] + target.encode(delta text), the recall block
       opening the new user turn's content; it must end with the generation prompt (else
       fresh); served + max_output > max_context, or served > 2 × |fresh| → rebuild
       (without a fresh result: compress first); otherwise continue / continue-compressed.

    A fresh result the gate declined to compress (`fresh.compressed` False) is served as
    is in mode "off" wherever a fresh compression would be used. `now` stamps new views.
    """
    if fresh is not None and fresh.plan is not None and fresh.plan is not prepared.plan:
        if fresh.plan.drafter.ids != prepared.plan.drafter.ids:
            raise ValueError("fresh was compressed from a different prompt than prepared")
    if not _views_on(prepared, config):
        return _without_view(fresh, "views_off")
    prompt = _prompt_facts(prepared, target_tokenizer, config)
    if prompt is None:
        return _without_view(fresh, "generation_prompt_not_suffix")

    same = view is not None and view.tenant == tenant and _same_prompt(view, prompt.raw)
    usable = view is not None and _usable(view, prompt, tenant)
    related = same or usable
    stale: Reason | None = None
    if related and view.selection != prompt.selection:
        stale = "options_changed"  # selected for another query, required set, ratio, mode
    elif same and _overflows(len(view.view_tokens), prepared):
        stale = "context_overflow"  # this request's max_tokens leaves the view no room
    if stale is not None:
        turn = view.turn + 1
        return _fresh_view(prompt, fresh, "rebuild", stale, turn, tenant, view.conversation, now)
    if same:
        return ViewDecision(
            action="serve",
            mode="repeat",
            reason="repeat",
            turn=view.turn,
            served_ids=view.view_tokens,
            served_text=decode_ids(target_tokenizer, view.view_tokens),
            snapshot_cut=view.view_gen_begin,
            view=replace(view, used=now),
            reused_tokens=view.view_gen_begin,
            fresh_tokens=_fresh_tokens(fresh),
        )

    if not usable:
        reason: Reason = "no_view" if view is None else "view_unusable"
        return _fresh_view(prompt, fresh, "fresh", reason, 1, tenant, conversation, now)

    layout = prompt.plan.layout
    assert layout is not None
    new_tokens = len(prompt.raw) - view.raw_gen_begin
    compress_new = new_tokens >= config.chat_compress_new_tokens
    user_turn = _latest_user_turn(layout)
    new_question = user_turn is not None and user_turn.role_begin >= view.drafter_gen_begin
    recall = new_question and config.chat_recall
    if fresh is None and (compress_new or recall):
        if compress_new:
            return ViewDecision(
                "compress_first", "off", "compress_new", part_begin=view.drafter_gen_begin
            )
        return ViewDecision("compress_first", "off", "recall")
    if fresh is not None and not fresh.compressed and (compress_new or recall):
        return _without_view(fresh, "gate_declined")
    compressed_fresh = fresh if fresh is not None and fresh.compressed else None
    turn = view.turn + 1

    n = prompt.n_drafter
    recalled: tuple[Span, ...] = ()
    if recall:
        assert compressed_fresh is not None
        # whether a question names its evidence is known from lexical evidence only
        asks = config.select_lexical != "off" and _asks(prompt.plan.drafter.text, user_turn)
        min_lift = config.chat_recall_min_lift
        recalled = recall_spans(view, compressed_fresh, n, min_lift, asks=asks)
        if 3 * total_tokens(recalled) > total_tokens(compressed_fresh.kept_spans):
            return _fresh_view(
                prompt, fresh, "rebuild", "recall_over_third", turn, tenant, view.conversation, now
            )

    # §6.1 steps 9-12: the delta appended to the view's cached prefix
    if compress_new:
        assert compressed_fresh is not None
        if compressed_fresh.part_begin == view.drafter_gen_begin:
            delta = compressed_fresh.part_spans  # the new part selected on its own at r0
        else:  # no part selection (the legacy selector; a part with nothing kept): its share
            # of the whole selection
            delta = subtract(compressed_fresh.kept_spans, [Span(0, view.drafter_gen_begin)])
    else:
        delta = (Span(view.drafter_gen_begin, n),)
    block = _recall_block(prompt.plan, recalled, target_tokenizer, drafter_tokenizer)
    split = user_turn.content_begin if new_question and block else n
    paragraph = compress_new and config.select_paragraph_join
    delta_text = _delta_text(prompt.plan, delta, split, block, paragraph, drafter_tokenizer)
    served = view.view_tokens[: view.view_gen_begin] + encoding.encode(
        target_tokenizer, delta_text.text, delta_text.controls
    )

    # §6.1 steps 13-14: the served prompt must still end with the generation prompt and
    # stay within the context and within twice the fresh compression
    if not _ends_with(served, prompt.gen_ids):
        return _fresh_view(
            prompt, fresh, "fresh", "generation_prompt_lost", 1, tenant, view.conversation, now
        )
    overflow = _overflows(len(served), prepared)
    over_2x = compressed_fresh is not None and len(served) > 2 * len(compressed_fresh.served_ids)
    if overflow or over_2x:
        why: Reason = "context_overflow" if overflow else "served_over_2x_fresh"
        if fresh is None:
            return ViewDecision("compress_first", "off", why)
        return _fresh_view(prompt, fresh, "rebuild", why, turn, tenant, view.conversation, now)

    new_view = _view_record(
        prompt,
        served,
        union(view.spans, delta, recalled),
        turn=turn,
        tenant=tenant,
        conversation=view.conversation,
        now=now,
    )
    if compress_new:
        reason = "compress_new"
    elif recall:
        reason = "recall"
    else:
        reason = "follow_up" if new_question else "agent_step"
    return ViewDecision(
        action="serve",
        mode="continue-compressed" if compress_new else "continue",
        reason=reason,
        turn=turn,
        served_ids=served,
        served_text=decode_ids(target_tokenizer, served),
        snapshot_cut=new_view.view_gen_begin,
        view=new_view,
        delta_spans=canonicalize(delta),
        recalled_spans=recalled,
        reused_tokens=view.view_gen_begin,
        recalled_tokens=len(encoding.encode_text(target_tokenizer, block)),
        fresh_tokens=_fresh_tokens(fresh),
    )


def recall_spans(
    view: View, fresh: Compressed, n_drafter: int, min_lift: float, *, asks: bool = False
) -> tuple[Span, ...]:
    """§6.2: the drafter spans a new question attends to that the view does not hold.

    in_view = the view's spans and everything from its generation prompt on (the new turn
    is appended anyway). With lifts (head scorer), by what the new turn is:
    - a question that names its evidence (kept lexical units it names:
      `Compressed.named_spans`): the kept lexical evidence and the kept parts of the
      passages the evidence signals rank best. No high-lift candidates: the named units hold
      its evidence, and in the agent benchmark the lifts added test-log and diff lines
      around them (half of what literal questions recalled, each token prefilled by the
      target before the first answer token);
    - a question that names nothing (`asks`: the turn holds a question, no named unit;
      never with lexical evidence off, where naming is unknown): the fresh selection's kept
      candidates outside the view, best first (`Compressed.ranked_spans`), while they fit
      a third of the fresh selection (`RECALL_SHARE`). Why: its evidence is found by the
      selection's whole mix (attention, the passage signals, lexical overlap of plain
      words), not by any one part of it: in the agent benchmark recalling only the
      best-lifted or best-signalled candidates kept it in 14 of 24 questions. All of what
      the fresh selection kept would (24 of 24) but exceeds a third of it, which rebuilds
      the view: the target then prefills the whole fresh prompt (0.15x the full prompt's
      TTFT at 4K, 3.5K tokens at 32K) where the capped recall appends to what it cached;
    - a turn that asks nothing ("Thanks, go on."): candidates whose lift is at least
      `min_lift`, the kept lexical evidence and the signals' best passages; a content-free
      turn names no rare word and its lifts stay near uniform, so it recalls little.
    Without lifts (legacy scorer): the fresh kept spans minus in_view. Canonical, drafter
    tokens of the new prompt.
    """
    in_view = union(view.spans, [Span(view.drafter_gen_begin, n_drafter)])
    if not fresh.candidate_lifts:
        return subtract(fresh.kept_spans, in_view)
    if fresh.named_spans:  # the question names its evidence: lexical evidence finds it
        return subtract(union(fresh.lexical_spans, fresh.evidence_spans), in_view)
    if asks:  # a question in other words: the best of what the whole selection found
        return _best_within(fresh, in_view)
    hot = [span for span, lift in fresh.candidate_lifts if lift >= min_lift]
    return subtract(union(hot, fresh.lexical_spans, fresh.evidence_spans), in_view)


RECALL_SHARE = 1 / 3  # a question in other words recalls at most this share of fresh


def _best_within(fresh: Compressed, in_view: Sequence[Span]) -> tuple[Span, ...]:
    """The parts of the fresh kept candidates outside `in_view`, best first, each taken
    while the total stays within `RECALL_SHARE` of the fresh kept tokens (one that does not
    fit is skipped). Without a ranking: all fresh kept spans outside `in_view`."""
    if not fresh.ranked_spans:
        return subtract(fresh.kept_spans, in_view)
    cap = RECALL_SHARE * total_tokens(fresh.kept_spans)
    out: list[Span] = []
    used = 0
    view = SpanIndex(in_view)
    for span in fresh.ranked_spans:
        parts = view.subtract([span])
        size = total_tokens(parts)
        if size and used + size <= cap:
            out += parts
            used += size
    return canonicalize(out)


def _asks(text: str, turn: Turn) -> bool:
    """Whether a user turn holds a question about something: a sentence that is
    question-like (`words.is_question_like`, the last one closing the turn) with a word
    that is no stopword. "Are you sure?" and "What now?" ask about nothing. Linear in the
    turn."""
    units = split_units(text, turn.char_content_begin, turn.char_content_end, max_chars=None)
    last = len(units) - 1
    return any(
        is_question_like(text[b:e], closes_turn=i == last)
        and any(not w.stop for w in words(text, b, e))
        for i, (b, e) in enumerate(units)
    )


# --------------------------------------------------------------------------- decision steps


def _views_on(prepared: Prepared, config: ViewPart) -> bool:
    """§6.1 preconditions that do not depend on tokens: chat_view, strict selection, a chat
    request whose prompt has a generation prompt."""
    plan = prepared.plan
    return (
        config.chat_view
        and config.selection.strict
        and plan.input_kind == "messages"
        and plan.layout is not None
        and plan.layout.has_generation_prompt
    )


def _prompt_facts(
    prepared: Prepared, target_tokenizer: Tokenizer, config: ViewPart
) -> _Prompt | None:
    """The new prompt's generation prompt in both vocabularies and its options' digest, or
    None when the target-encoded generation prompt is not a suffix of the raw prompt (§6.1
    precondition)."""
    plan = prepared.plan
    raw = tuple(map(int, prepared.input.prompt.ids))
    layout = plan.layout
    if layout.generation_turn_index is None:
        return None
    gen_turn = layout.turns[layout.generation_turn_index]
    text, begin = plan.drafter.text, gen_turn.char_role_begin
    controls = encoding.controls_within(
        encoding.prompt_controls(target_tokenizer, plan.drafter), begin, len(text)
    )
    gen_ids = encoding.encode(target_tokenizer, text[begin:], controls)
    if not gen_ids or not _ends_with(raw, gen_ids):
        return None
    return _Prompt(
        raw,
        gen_ids,
        len(raw) - len(gen_ids),
        plan,
        layout.generation_begin,
        selection_digest(prepared, config),
    )


def _same_prompt(view: View, raw: tuple[int, ...]) -> bool:
    return view.raw_len == len(raw) and view.raw_digest == token_digest(raw)


def _usable(view: View, prompt: _Prompt, tenant: str) -> bool:
    """§6.1 step 2 and the lookup conditions: same tenant; the view's raw prefix and drafter
    prefix are prefixes of this prompt; the view ends before this prompt's generation
    prompt (there is something to append)."""
    return (
        view.tenant == tenant
        and 0 < view.drafter_gen_begin < prompt.drafter_gen_begin
        and 0 < view.view_gen_begin <= len(view.view_tokens)
        and view.raw_gen_begin <= prompt.raw_gen_begin
        and token_digest(prompt.raw[: view.raw_gen_begin]) == view.raw_prefix_digest
        and token_digest(prompt.plan.drafter.ids[: view.drafter_gen_begin])
        == view.drafter_prefix_digest
    )


def _latest_user_turn(layout: ChatLayout) -> Turn | None:
    for turn in reversed(layout.turns):
        if turn.role == "user":
            return turn
    return None


def _fresh_tokens(fresh: Compressed | None) -> int:
    return len(fresh.served_ids) if fresh is not None else 0


def _without_view(fresh: Compressed | None, reason: Reason) -> ViewDecision:
    """Mode "off": serve the fresh result untouched, remember nothing."""
    if fresh is None:
        return ViewDecision("compress_first", "off", reason)
    return ViewDecision(
        action="serve",
        mode="off",
        reason=reason,
        served_ids=tuple(fresh.served_ids),
        served_text=fresh.served_text,
        fresh_tokens=len(fresh.served_ids),
    )


def _fresh_view(
    prompt: _Prompt,
    fresh: Compressed | None,
    mode: ViewMode,
    reason: Reason,
    turn: int,
    tenant: str,
    conversation: str,
    now: float,
) -> ViewDecision:
    """Serve the fresh compression and make it the conversation's view (fresh / rebuild).

    Without a fresh result: compress first. An uncompressed fresh result (the gate
    declined), or one that does not end with the generation prompt, is served in mode
    "off" with no view: a view must be a compressed prompt with a known snapshot cut."""
    if fresh is None:
        return ViewDecision("compress_first", "off", reason)
    served = tuple(map(int, fresh.served_ids))
    if not fresh.compressed:
        return _without_view(fresh, "gate_declined")
    if not _ends_with(served, prompt.gen_ids):
        return _without_view(fresh, "generation_prompt_not_suffix")
    view = _view_record(
        prompt,
        served,
        canonicalize(fresh.kept_spans),
        turn=turn,
        tenant=tenant,
        conversation=conversation,
        now=now,
    )
    return ViewDecision(
        action="serve",
        mode=mode,
        reason=reason,
        turn=turn,
        served_ids=served,
        served_text=fresh.served_text,
        snapshot_cut=view.view_gen_begin,
        view=view,
        fresh_tokens=len(served),
    )


def _view_record(
    prompt: _Prompt,
    served: tuple[int, ...],
    spans: tuple[Span, ...],
    *,
    turn: int,
    tenant: str,
    conversation: str,
    now: float,
) -> View:
    """The view of `served` (target tokens, ending with the generation prompt) for this
    prompt; `spans` are the drafter spans it covers."""
    raw, ids = prompt.raw, prompt.plan.drafter.ids
    return View(
        tenant=tenant,
        conversation=conversation,
        raw_len=len(raw),
        raw_digest=token_digest(raw),
        raw_gen_begin=prompt.raw_gen_begin,
        raw_prefix_digest=token_digest(raw[: prompt.raw_gen_begin]),
        drafter_gen_begin=prompt.drafter_gen_begin,
        drafter_prefix_digest=token_digest(ids[: prompt.drafter_gen_begin]),
        view_tokens=served,
        view_gen_begin=len(served) - len(prompt.gen_ids),
        spans=spans,
        turn=turn,
        created=now,
        used=now,
        selection=prompt.selection,
    )


def _overflows(served_tokens: int, prepared: Prepared) -> bool:
    """served + max_output > max_context (target tokens); no limit without a context."""
    max_ctx = prepared.input.max_context
    if max_ctx is None or max_ctx <= 0:
        return False
    return served_tokens + prepared.input.max_output > max_ctx


def _recall_block(
    plan: Plan, recalled: Sequence[Span], target_tokenizer: Tokenizer, drafter_tokenizer: Tokenizer
) -> str:
    """The recall block text for recalled drafter spans ("" when none), excerpts stripped of
    the prompt's chat markers."""
    if not recalled:
        return ""
    role_markers, end_markers, generic = _family_markers(plan.layout, target_tokenizer)
    return recall_text(
        drafter_tokenizer,
        plan.drafter.ids,
        recalled,
        role_markers=role_markers,
        end_markers=end_markers,
        generic_role=generic,
    )


def _delta_text(
    plan: Plan,
    delta: Sequence[Span],
    split: int,
    block: str,
    paragraph: bool,
    drafter_tokenizer: Tokenizer,
) -> encoding.ControlledText:
    """§6.1 step 11: join(delta before `split`) + recall block + join(delta after), where
    `split` (drafter tokens) is the new user turn's content start when there is a block;
    with the prompt's controls it keeps (the recall block is text)."""
    n = plan.n_tokens
    before = [s.clip(0, split) for s in delta]
    after = [s.clip(split, n) for s in delta]
    return encoding.concat(
        joined_runs(drafter_tokenizer, plan.drafter, before, paragraph=paragraph),
        encoding.ControlledText(block, ()),
        joined_runs(drafter_tokenizer, plan.drafter, after, paragraph=paragraph),
    )


def _family_markers(
    layout: ChatLayout, target_tokenizer: Tokenizer
) -> tuple[tuple[str, ...], tuple[str, ...], bool]:
    """(role marker texts, end marker texts, generic role) of the prompt's marker family, as
    the target renders them: what `clean_excerpt` strips from recalled excerpts."""
    family = next(f for f in FAMILIES if f.name == layout.family)
    roles = tuple(resolve_marker(target_tokenizer, m).text for m, _ in family.role_markers)
    ends = tuple(resolve_marker(target_tokenizer, m).text for m in family.end_markers)
    return roles, ends, any(role is None for _, role in family.role_markers)


def _ends_with(ids: Sequence[int], suffix: Sequence[int]) -> bool:
    return 0 < len(suffix) <= len(ids) and tuple(ids[len(ids) - len(suffix) :]) == tuple(suffix)
