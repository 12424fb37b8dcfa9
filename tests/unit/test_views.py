"""decide_view (ALGORITHM §6.1-§6.3, §10.4 item 39) on real tokenizers.

Every prompt is rendered with the target's chat template and compressed through
`pipeline.prepare` / `finish.finish` with a deterministic scorer (a test double of the
drafter that puts attention mass on given sentences), so the views are built from the same
objects the ingress hands over. What is asserted is the decision: outcome, served tokens,
snapshot cut, the view to store and the ViewStats counts.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pflash.compress.assemble import RECALL_FOOTER, RECALL_HEADER
from pflash.compress.finish import finish
from pflash.compress.pipeline import CompressionRequest, prepare
from pflash.compress.render.chat import render_chat
from pflash.compress.render.rendered import RenderedPrompt
from pflash.compress.scoring import ScoreResult
from pflash.config import build_config
from pflash.errors import CompressionFailed
from pflash.flow.compressor import Compressor
from pflash.flow.in_process import LocalStore, local_scorer
from pflash.flow.request import compression_request, render_request
from pflash.serving.admission import request_params
from pflash.serving.chat_completion.serving import parse_chat_request
from pflash.serving.envelope import error_response
from pflash.serving.usage import PFlashStats
from pflash.spans import Span, decode_ids, subtract, union
from pflash.views.decision import decide_view
from pflash.views.keys import boundary_hashes, token_digest, view_keys
from pflash.views.records import served_result
from pflash.views.store import ViewStore

NEEDLE = "The special magic quokka number is: 7318842."
FACT = "The archive password for the blue vault is heliotrope-42."
PASTE_FACT = "The launch code for the red rocket is 55-ALPHA-9."
QUESTION = "What is the special magic quokka number?"
# views over drafter doubles that answer attention only (semantic evidence: test_passage_evidence.py);
# new material is appended verbatim unless a test lowers chat_compress_new_tokens
CFG = dict(
    mode="always",
    keep_ratio=0.2,
    select_chunk_size=32,
    select_semantic_weight=0.0,
    chat_compress_new_tokens=16384,
)
MAX_OUTPUT = 64


def _document() -> str:
    body = open("/usr/share/common-licenses/GPL-3").read()[:8000]
    early = body.index("\n\n", len(body) // 5)
    mid = body.index("\n\n", len(body) // 2)
    return body[:early] + "\n\n" + FACT + body[early:mid] + "\n\n" + NEEDLE + body[mid:]


def _paste(chars: int = 8000) -> str:
    body = open("/usr/share/common-licenses/Apache-2.0").read()[:chars]
    mid = body.index("\n\n", len(body) // 2)
    return body[:mid] + "\n\n" + PASTE_FACT + body[mid:]


TURN1 = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": _document() + "\n\n" + QUESTION},
]


class Conversation:
    """One conversation against one config: prepare, score, decide, remember."""

    def __init__(self, target, drafter=None, tenant="tenant-a", max_context=8192, **cfg):
        self.target = target
        self.drafter = drafter or target
        self.config = build_config({**CFG, **cfg}, env={})
        self.tenant = tenant
        self.max_context = max_context
        self.store = ViewStore(16, 3600.0, clock=lambda: 100.0)
        self.scored = 0

    def prepare(self, messages, max_context=None, config=None, **options):
        """`options`: the request's own CompressionRequest fields (pflash_query, pflash_required)."""
        text = render_chat(self.target, messages)
        ids = tuple(self.target(text, add_special_tokens=False)["input_ids"])
        inp = CompressionRequest(
            RenderedPrompt("chat", tuple(ids), self.target, messages=messages),
            max_output=MAX_OUTPUT,
            max_context=max_context or self.max_context,
            **options,
        )
        return prepare(
            inp,
            config=config or self.config,
            target_tokenizer=self.target,
            drafter_tokenizer=self.drafter,
        )

    def fresh(self, prepared, attend_to, config=None):
        """The fresh compression, scored by attention mass on the sentences `attend_to`."""
        self.scored += 1
        drafter = prepared.plan.drafter
        req = prepared.score_request
        mass = np.full(len(req.ids), 1e-6, dtype=np.float32)
        for sentence in attend_to:
            b = drafter.text.rindex(sentence)
            e = b + len(sentence)
            for i, (tb, te) in enumerate(drafter.offsets):
                if tb < e and te > b:
                    mass[i] = 1.0
        mass[req.query.begin : req.query.end] = 0.0
        scores = ScoreResult(mass=mass / mass.sum(), scorer_new_tokens=len(req.ids))
        return finish(
            prepared,
            scores,
            config=config or self.config,
            target_tokenizer=self.target,
            drafter_tokenizer=self.drafter,
        )

    def decide(self, prepared, view, fresh=None, tenant=None, now=100.0, config=None):
        return decide_view(
            prepared,
            view,
            fresh,
            tenant=tenant or self.tenant,
            conversation="conversation-1",
            config=config or self.config,
            target_tokenizer=self.target,
            drafter_tokenizer=self.drafter,
            now=now,
        )

    def turn(self, messages, attend_to=(NEEDLE,), max_context=None, config=None, **options):
        """The ingress flow: lookup, decide, (drafter, decide again), remember. `config`: the
        request's config (its overrides applied); `options`: its pflash_query/required."""
        prepared = self.prepare(messages, max_context, config, **options)
        view = self.store.lookup(self.tenant, view_keys(prepared, self.target))
        decision = self.decide(prepared, view, config=config)
        first = decision
        fresh = None
        if decision.needs_compression:  # as the compressor: the new part selected on its own
            part = replace(prepared, part_begin=decision.part_begin)
            fresh = self.fresh(part, attend_to, config)
            decision = self.decide(prepared, view, fresh, config=config)
        if decision.view is not None:
            self.store.remember(decision.view)
        return prepared, view, first, fresh, decision


def _reply(messages, answer, question):
    return [
        *messages,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": question},
    ]


def _agent_step(messages, call, output):
    return [*messages, {"role": "assistant", "content": call}, {"role": "tool", "content": output}]


def _gen_prompt(tok):
    return tuple(tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"])


# --------------------------------------------------------------------------- fresh and repeat


def test_first_turn_compresses_first_then_serves_the_fresh_prompt_as_a_view(smollm2_tokenizer):
    conv = Conversation(smollm2_tokenizer)
    prepared, view, first, fresh, d = conv.turn(TURN1)
    assert view is None
    assert (first.action, first.reason) == ("compress_first", "no_view")
    assert (d.action, d.mode, d.reason, d.turn) == ("serve", "fresh", "no_view", 1)
    assert d.served_ids == fresh.served_ids and d.served_text == fresh.served_text
    gen = _gen_prompt(smollm2_tokenizer)
    assert d.snapshot_cut == len(d.served_ids) - len(gen)
    assert d.served_ids[d.snapshot_cut :] == gen
    v = d.view
    assert (v.turn, v.tenant, v.conversation) == (1, "tenant-a", "conversation-1")
    assert v.view_tokens == fresh.served_ids and v.spans == fresh.kept_spans
    raw = prepared.input.prompt.ids
    assert v.raw_gen_begin == len(raw) - len(gen)
    assert v.raw_prefix_digest == token_digest(raw[: v.raw_gen_begin])
    assert v.drafter_gen_begin == prepared.plan.generation_begin
    assert d.view_stats() == {
        "mode": "fresh",
        "turn": 1,
        "served_tokens": len(fresh.served_ids),
        "reused_tokens": 0,
        "delta_tokens": len(fresh.served_ids),
        "recalled_tokens": 0,
        "fresh_tokens": len(fresh.served_ids),
    }


def test_same_prompt_repeats_the_byte_identical_served_prompt(smollm2_tokenizer):
    conv = Conversation(smollm2_tokenizer)
    *_, d1 = conv.turn(TURN1)
    prepared, view, first, fresh, d2 = conv.turn(TURN1)
    assert fresh is None and conv.scored == 1  # the drafter ran once, on turn 1
    assert (d2.mode, d2.reason, d2.turn) == ("repeat", "repeat", 1)
    assert d2.served_ids == d1.served_ids and d2.served_text == d1.served_text
    assert d2.snapshot_cut == d1.snapshot_cut
    assert d2.reused_tokens == d1.snapshot_cut
    assert d2.delta_tokens == len(_gen_prompt(smollm2_tokenizer))


def test_lookup_keys_of_the_next_turn_find_the_previous_view(smollm2_tokenizer):
    conv = Conversation(smollm2_tokenizer)
    *_, d1 = conv.turn(TURN1)
    prepared = conv.prepare(_reply(TURN1, "7318842.", "Thanks!"))
    keys = view_keys(prepared, smollm2_tokenizer)
    assert d1.view.key in keys
    # one key per turn start after the first: user, assistant, user, generation prompt
    assert len(keys) == 4
    assert conv.store.lookup("tenant-a", keys) is not None


def test_boundary_hashes_equal_the_digest_of_each_prefix():
    raw = list(range(1000, 1100))
    hashes = boundary_hashes(raw, [40, 10, 100, 0, 250])
    assert [h.length for h in hashes] == [10, 40, 100]
    assert [h.digest for h in hashes] == [token_digest(raw[:n]) for n in (10, 40, 100)]
    assert token_digest(raw[:10]) != token_digest(raw[1:11])


# --------------------------------------------------------------------------- options


def test_a_required_string_is_not_served_a_view_selected_without_it(smollm2_tokenizer):
    conv = Conversation(smollm2_tokenizer)
    *_, d1 = conv.turn(TURN1)
    assert FACT not in d1.served_text
    prepared, view, first, fresh, d = conv.turn(TURN1, pflash_required=(FACT,))
    assert view is not None and view.view_tokens == d1.served_ids  # the same prompt's view
    assert (first.action, first.reason) == ("compress_first", "options_changed")
    assert (d.mode, d.reason, d.turn) == ("rebuild", "options_changed", 2)
    assert d.served_ids == fresh.served_ids and FACT in d.served_text
    assert d.view.selection != d1.view.selection
    # the same options again repeat the new view; the first request's options rebuild again
    *_, again = conv.turn(TURN1, pflash_required=(FACT,))
    assert (again.mode, again.served_ids) == ("repeat", d.served_ids)
    *_, back = conv.turn(TURN1)
    assert (back.mode, back.reason) == ("rebuild", "options_changed")
    assert back.served_ids == d1.served_ids


@pytest.mark.parametrize(
    ("options", "overrides"),
    [
        ({"pflash_query": "The archive password for the blue vault"}, {}),
        ({}, {"keep_ratio": 0.3}),
        ({}, {"mode": "auto", "threshold": 0}),
        ({}, {"select_lexical": "off"}),
    ],
    ids=["pflash_query", "keep_ratio", "mode", "scorer_config"],
)
def test_a_view_is_repeated_only_for_the_options_it_was_selected_under(
    smollm2_tokenizer, options, overrides
):
    conv = Conversation(smollm2_tokenizer)
    *_, d1 = conv.turn(TURN1)
    config = build_config({**CFG, **overrides}, env={})
    prepared, view, first, fresh, d = conv.turn(TURN1, config=config, **options)
    assert view is not None
    assert (first.action, first.reason) == ("compress_first", "options_changed")
    assert (d.mode, d.reason) == ("rebuild", "options_changed")
    assert d.served_ids == fresh.served_ids


def test_a_view_is_continued_only_for_the_options_it_was_selected_under(smollm2_tokenizer):
    conv = Conversation(smollm2_tokenizer)
    conv.turn(TURN1)
    messages = _agent_step(TURN1, "search(quokka)", "nothing new")
    config = build_config({**CFG, "keep_ratio": 0.3}, env={})
    prepared, view, first, fresh, d = conv.turn(messages, config=config)
    assert (first.action, first.reason) == ("compress_first", "options_changed")
    assert (d.mode, d.reason, d.turn) == ("rebuild", "options_changed", 2)
    assert d.served_ids == fresh.served_ids and conv.scored == 2


def test_a_repeat_that_no_longer_fits_the_context_rebuilds(smollm2_tokenizer):
    conv = Conversation(smollm2_tokenizer)
    *_, d1 = conv.turn(TURN1)
    tight = len(d1.served_ids) + MAX_OUTPUT - 1
    prepared, view, first, fresh, d = conv.turn(TURN1, max_context=tight)
    assert (first.action, first.reason) == ("compress_first", "context_overflow")
    assert (d.mode, d.reason) == ("rebuild", "context_overflow")
    assert len(d.served_ids) + MAX_OUTPUT <= tight


def _flow(tokenizer, store):
    """The compression flow over an in-process view store, its drafter attending to NEEDLE."""

    def score(request):
        pieces = [decode_ids(tokenizer, [t]) for t in request.ids]
        offsets = np.cumsum([0] + [len(p) for p in pieces])
        begin = "".join(pieces).rindex(NEEDLE)
        inside = (offsets[1:] > begin) & (offsets[:-1] < begin + len(NEEDLE))
        mass = np.where(inside, 1.0, 1e-6).astype(np.float32)
        mass[request.query.begin : request.query.end] = 0.0
        return ScoreResult(mass=mass / mass.sum())

    return Compressor(
        target_tokenizer=tokenizer,
        drafter_tokenizer=tokenizer,
        scorer=local_scorer(score),
        store=LocalStore(store) if store is not None else None,
        max_context=8192,
    )


def _request(tokenizer, **fields):
    req = parse_chat_request({"messages": TURN1, "max_tokens": MAX_OUTPUT, **fields})
    config = build_config(CFG, env={}).with_request_overrides(keep_ratio=req.pflash_keep_ratio)
    return compression_request(
        req, render_request(req, "chat", tokenizer), config, "tenant-a", request_params(req, config)
    )


def test_a_request_naming_a_required_string_gets_it_though_its_prompt_has_a_view(
    smollm2_tokenizer,
):
    flow = _flow(smollm2_tokenizer, ViewStore(16, 3600.0))
    a = flow.run_sync(_request(smollm2_tokenizer))
    assert FACT not in a.served_text and a.stats["view"]["mode"] == "fresh"
    b = flow.run_sync(_request(smollm2_tokenizer, pflash_required=[FACT]))
    assert b.stats["view"]["mode"] == "rebuild"
    assert FACT in b.served_text and NEEDLE in b.served_text


def test_a_required_string_missing_from_what_is_served_fails_closed(smollm2_tokenizer, monkeypatch):
    """Whatever serves the prompt, the required strings are checked in it: here a view is
    (wrongly) taken as selected for any options, and the repeat it serves lacks the string."""
    monkeypatch.setattr("pflash.views.decision.selection_digest", lambda prepared, config: "")
    flow = _flow(smollm2_tokenizer, ViewStore(16, 3600.0))
    flow.run_sync(_request(smollm2_tokenizer))
    with pytest.raises(CompressionFailed) as info:
        flow.run_sync(_request(smollm2_tokenizer, pflash_required=[FACT]))
    assert info.value.stage == "required_check"
    assert error_response(info.value)[0] == 500


def test_the_flows_result_says_where_the_target_may_cut_its_snapshot(smollm2_tokenizer):
    """A view-served turn: its generation prompt's start in what is served; the prompt served
    as sent: the render's cut; a fresh compression without views: none (the render's cut
    indexes the prompt as sent, not what is served)."""
    job = _request(smollm2_tokenizer)
    viewed = _flow(smollm2_tokenizer, ViewStore(16, 3600.0)).run_sync(job)
    gen = _gen_prompt(smollm2_tokenizer)
    assert viewed.compressed and viewed.snapshot_cut == len(viewed.served_ids) - len(gen)
    fresh = _flow(smollm2_tokenizer, None).run_sync(job)
    assert fresh.compressed and fresh.snapshot_cut is None
    off = replace(job, config=job.config.with_request_overrides(mode="off"))
    whole = _flow(smollm2_tokenizer, None).run_sync(off)
    assert not whole.compressed and whole.snapshot_cut == job.prompt.snapshot_cut is not None


# --------------------------------------------------------------------------- continue


def test_new_question_asks_for_the_drafter_before_continuing(smollm2_tokenizer):
    conv = Conversation(smollm2_tokenizer)
    conv.turn(TURN1)
    prepared, view, first, fresh, d = conv.turn(_reply(TURN1, "7318842.", "Are you sure?"))
    assert view is not None
    assert (first.action, first.reason) == ("compress_first", "recall")
    assert fresh is not None and conv.scored == 2


def test_small_follow_up_continues_as_a_strict_extension_of_the_view(smollm2_tokenizer):
    # attention only: lexical evidence keeps just the needle sentence in turn 1, so turn 2's
    # attention chunk around it would (rightly) be recalled; this test is about the extension
    conv = Conversation(smollm2_tokenizer, select_lexical="off")
    *_, d1 = conv.turn(TURN1)
    messages = _reply(TURN1, "7318842.", "Are you sure?")
    prepared, view, first, fresh, d2 = conv.turn(messages)
    assert (d2.mode, d2.reason, d2.turn) == ("continue", "recall", 2)
    assert d2.recalled_spans == ()  # attention stays on what the view already holds
    cut = d1.snapshot_cut
    assert d2.served_ids[:cut] == d1.served_ids[:cut]
    assert len(d2.served_ids) > cut
    assert d2.served_text.endswith(
        "<|im_start|>assistant\n7318842.<|im_end|>\n<|im_start|>user\nAre you sure?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert d2.reused_tokens == cut
    assert d2.delta_tokens == len(d2.served_ids) - cut
    assert d2.fresh_tokens == len(fresh.served_ids)
    assert d2.snapshot_cut == len(d2.served_ids) - len(_gen_prompt(smollm2_tokenizer))
    # the new view covers the old one plus everything from the old generation prompt on
    n = prepared.plan.n_tokens
    assert d2.view.spans == union(d1.view.spans, [Span(d1.view.drafter_gen_begin, n)])
    assert d2.view.view_tokens == d2.served_ids and d2.view.turn == 2
    # the third turn extends the second the same way
    *_, d3 = conv.turn(_reply(messages, "Yes.", "Good."))
    assert d3.mode == "continue" and d3.turn == 3
    assert d3.served_ids[: d2.snapshot_cut] == d2.served_ids[: d2.snapshot_cut]


def test_follow_up_with_recall_off_continues_without_the_drafter(smollm2_tokenizer):
    conv = Conversation(smollm2_tokenizer, chat_recall=False)
    conv.turn(TURN1)
    prepared, view, first, fresh, d = conv.turn(_reply(TURN1, "7318842.", "Are you sure?"))
    assert first is d and fresh is None and conv.scored == 1
    assert (d.mode, d.reason, d.fresh_tokens) == ("continue", "follow_up", 0)


def test_agent_step_is_appended_verbatim_without_scoring(smollm2_tokenizer):
    conv = Conversation(smollm2_tokenizer)
    *_, d1 = conv.turn(TURN1)
    output = "search results: quokka 7318842 confirmed by registry."
    messages = _agent_step(TURN1, "search(quokka)", output)
    prepared, view, first, fresh, d = conv.turn(messages)
    assert first is d and fresh is None and conv.scored == 1  # decided before any scoring
    assert (d.action, d.mode, d.reason, d.turn) == ("serve", "continue", "agent_step", 2)
    cut = d1.snapshot_cut
    assert d.served_ids[:cut] == d1.served_ids[:cut]
    delta = (
        "<|im_start|>assistant\nsearch(quokka)<|im_end|>\n<|im_start|>tool\n"
        + output
        + "<|im_end|>\n<|im_start|>assistant\n"
    )
    assert d.served_ids[cut:] == tuple(
        smollm2_tokenizer(delta, add_special_tokens=False)["input_ids"]
    )
    assert d.delta_spans == (Span(d1.view.drafter_gen_begin, prepared.plan.n_tokens),)


def test_big_paste_continues_compressed(smollm2_tokenizer):
    conv = Conversation(smollm2_tokenizer, chat_compress_new_tokens=1000)
    *_, d1 = conv.turn(TURN1)
    paste = _paste()
    messages = _reply(TURN1, "7318842.", paste + "\n\nWhat is the launch code for the red rocket?")
    prepared, view, first, fresh, d = conv.turn(messages, attend_to=(PASTE_FACT,))
    new_tokens = len(prepared.input.prompt.ids) - d1.view.raw_gen_begin
    assert new_tokens >= 1000
    assert (first.action, first.reason) == ("compress_first", "compress_new")
    assert (d.mode, d.reason, d.turn) == ("continue-compressed", "compress_new", 2)
    cut = d1.snapshot_cut
    assert d.served_ids[:cut] == d1.served_ids[:cut]
    # the part past the previous view, selected on its own at the keep ratio
    begin = d1.view.drafter_gen_begin
    assert first.part_begin == begin and fresh.part_begin == begin
    assert d.delta_spans == fresh.part_spans
    assert all(span.begin >= begin for span in d.delta_spans)
    assert d.delta_tokens < new_tokens / 2
    assert PASTE_FACT in d.served_text
    assert d.served_text.endswith(
        "What is the launch code for the red rocket?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_tool_output_is_compressed_into_the_view_at_the_keep_ratio(smollm2_tokenizer):
    """An agent step's output past chat_compress_new_tokens is selected on its own at r0:
    the view grows by about r0 of it, keeps what it attends to, and the served prefix the
    target has cached is unchanged (a whole-prompt selection gave such an output ~13 tokens
    in the agent benchmark: its budget went to text the view already held)."""
    conv = Conversation(smollm2_tokenizer, chat_compress_new_tokens=512)
    *_, d1 = conv.turn(TURN1)
    messages = _agent_step(TURN1, "read(license)", _paste())
    prepared, view, first, fresh, d = conv.turn(messages, attend_to=(NEEDLE, PASTE_FACT))
    assert (first.action, first.reason) == ("compress_first", "compress_new")
    assert (d.mode, d.reason, d.turn) == ("continue-compressed", "compress_new", 2)
    assert d.served_ids[: d1.snapshot_cut] == d1.served_ids[: d1.snapshot_cut]
    assert PASTE_FACT in d.served_text
    begin = d1.view.drafter_gen_begin
    part = prepared.plan.n_tokens - begin
    kept = sum(span.end - span.begin for span in d.delta_spans)
    # r0 of the part plus its pinned markers and generation prompt, never the raw output
    assert 0.2 * part * 0.8 <= kept <= 0.2 * part + 64
    # the whole-prompt selection would have given the part far less than r0 of it
    whole = subtract(fresh.kept_spans, [Span(0, begin)])
    assert sum(span.end - span.begin for span in whole) < kept


def test_the_new_part_is_selected_only_from_its_own_tokens(smollm2_tokenizer):
    conv = Conversation(smollm2_tokenizer)
    prepared = conv.prepare(_agent_step(TURN1, "read(license)", _paste()))
    begin = prepared.plan.n_tokens // 2
    fresh = conv.fresh(replace(prepared, part_begin=begin), (NEEDLE, PASTE_FACT))
    assert fresh.part_begin == begin and fresh.part_spans
    assert all(
        begin <= span.begin < span.end <= prepared.plan.n_tokens for span in fresh.part_spans
    )
    whole = conv.fresh(prepared, (NEEDLE, PASTE_FACT))
    assert (whole.part_begin, whole.part_spans) == (0, ())
    assert whole.served_ids == fresh.served_ids  # the whole selection is unchanged by it


# --------------------------------------------------------------------------- recall


def test_recall_block_opens_the_new_user_turn(smollm2_tokenizer):
    conv = Conversation(smollm2_tokenizer)
    *_, d1 = conv.turn(TURN1)
    assert FACT not in d1.served_text  # turn 1 dropped it
    question = "And what is the archive password for the blue vault?"
    prepared, view, first, fresh, d = conv.turn(
        _reply(TURN1, "7318842.", question), attend_to=(FACT,)
    )
    assert (d.mode, d.reason) == ("continue", "recall")
    assert d.recalled_spans and d.recalled_tokens > 0
    recalled_text = decode_ids(smollm2_tokenizer, _ids(prepared, d.recalled_spans))
    assert FACT in recalled_text
    opening = "<|im_start|>user\n" + RECALL_HEADER
    assert opening in d.served_text
    after_header = d.served_text.split(opening, 1)[1]
    excerpts, rest = after_header.split(RECALL_FOOTER, 1)
    assert FACT in excerpts and "<|im_start|>" not in excerpts
    assert rest == question + "<|im_end|>\n<|im_start|>assistant\n"
    # the recall block comes after everything cached
    assert d.served_ids[: d1.snapshot_cut] == d1.served_ids[: d1.snapshot_cut]
    assert subtract(d.recalled_spans, d.view.spans) == ()  # the new view covers the recall


def test_recall_without_lifts_falls_back_to_the_set_difference(smollm2_tokenizer):
    conv = Conversation(smollm2_tokenizer)
    *_, d1 = conv.turn(TURN1)
    prepared = conv.prepare(_reply(TURN1, "7318842.", "And the archive password?"))
    view = conv.store.lookup("tenant-a", view_keys(prepared, smollm2_tokenizer))
    fresh = replace(conv.fresh(prepared, (FACT,)), candidate_lifts=())
    d = conv.decide(prepared, view, fresh)
    n = prepared.plan.n_tokens
    in_view = union(view.spans, [Span(view.drafter_gen_begin, n)])
    assert d.recalled_spans == subtract(fresh.kept_spans, in_view)
    assert d.recalled_spans  # the kept FACT chunk is outside the view


def test_recall_of_more_than_a_third_of_fresh_rebuilds(smollm2_tokenizer):
    conv = Conversation(smollm2_tokenizer)
    *_, d1 = conv.turn(TURN1)
    document = TURN1[1]["content"]
    wide = document[len(document) // 10 : len(document) * 2 // 5]  # a third of the document
    prepared, view, first, fresh, d = conv.turn(
        _reply(TURN1, "7318842.", "Go over the first part again."), attend_to=(wide,)
    )
    assert (d.mode, d.reason, d.turn) == ("rebuild", "recall_over_third", 2)
    assert d.served_ids == fresh.served_ids
    assert d.view.turn == 2 and d.view.view_tokens == fresh.served_ids
    assert d.snapshot_cut == len(fresh.served_ids) - len(_gen_prompt(smollm2_tokenizer))
    assert d.reused_tokens == 0


# --------------------------------------------------------------------------- rebuild bounds


def test_view_over_twice_the_fresh_compression_rebuilds(smollm2_tokenizer):
    conv = Conversation(smollm2_tokenizer)
    conv.turn(TURN1)
    messages = _reply(TURN1, "7318842.", _paste() + "\n\nKeep the quokka number in mind too.")
    prepared, view, first, fresh, d = conv.turn(messages)
    assert first.reason == "recall"  # small enough to append verbatim, but a new user turn
    assert (d.mode, d.reason, d.turn) == ("rebuild", "served_over_2x_fresh", 2)
    assert d.served_ids == fresh.served_ids
    verbatim = len(view.view_tokens) + len(prepared.input.prompt.ids) - view.raw_gen_begin
    assert verbatim > 2 * len(fresh.served_ids)


def test_context_overflow_rebuilds_from_a_fresh_compression(smollm2_tokenizer):
    conv = Conversation(smollm2_tokenizer)
    conv.turn(TURN1)
    messages = _agent_step(TURN1, "fetch(license)", _paste(4000))
    fits = conv.decide(conv.prepare(messages), conv.store.lookup("tenant-a", _keys(conv, messages)))
    assert (fits.mode, fits.reason) == ("continue", "agent_step")
    tight = len(fits.served_ids) + MAX_OUTPUT - 1
    prepared, view, first, fresh, d = conv.turn(messages, max_context=tight)
    assert (first.action, first.reason) == ("compress_first", "context_overflow")
    assert (d.mode, d.reason, d.turn) == ("rebuild", "context_overflow", 2)
    assert d.served_ids == fresh.served_ids
    assert len(d.served_ids) + MAX_OUTPUT <= tight


# --------------------------------------------------------------------------- no view


def test_chat_view_false_always_serves_the_fresh_compression(smollm2_tokenizer):
    conv = Conversation(smollm2_tokenizer)
    *_, d1 = conv.turn(TURN1)
    off = Conversation(smollm2_tokenizer, chat_view=False)
    prepared = off.prepare(TURN1)
    d = off.decide(prepared, d1.view)  # even the same prompt with its view at hand
    assert (d.action, d.reason) == ("compress_first", "views_off")
    fresh = off.fresh(prepared, (NEEDLE,))
    d = off.decide(prepared, d1.view, fresh)
    assert (d.action, d.mode, d.view, d.snapshot_cut) == ("serve", "off", None, None)
    assert d.served_ids == fresh.served_ids


def test_legacy_selector_has_no_views(smollm2_tokenizer):
    conv = Conversation(smollm2_tokenizer, select_mode="legacy")
    d = conv.decide(conv.prepare(TURN1), None)
    assert (d.action, d.reason) == ("compress_first", "views_off")


def test_another_tenants_view_is_never_used(smollm2_tokenizer):
    conv = Conversation(smollm2_tokenizer)
    *_, d1 = conv.turn(TURN1)
    prepared = conv.prepare(TURN1)
    d = conv.decide(prepared, d1.view, tenant="tenant-b")
    assert (d.action, d.reason) == ("compress_first", "view_unusable")
    d = conv.decide(prepared, d1.view, conv.fresh(prepared, (NEEDLE,)), tenant="tenant-b")
    assert (d.mode, d.view.tenant, d.turn) == ("fresh", "tenant-b", 1)


def test_a_view_of_a_different_conversation_is_not_continued(smollm2_tokenizer):
    conv = Conversation(smollm2_tokenizer)
    *_, d1 = conv.turn(TURN1)
    other = [TURN1[0], {"role": "user", "content": "A different first question?"}]
    prepared = conv.prepare(_reply(other, "Sure.", "Next?"))
    d = conv.decide(prepared, d1.view)
    assert (d.action, d.reason) == ("compress_first", "view_unusable")


def test_gate_declined_fresh_result_is_served_without_a_view(smollm2_tokenizer):
    from pflash.compress.pipeline import uncompressed

    conv = Conversation(smollm2_tokenizer, mode="auto", threshold=1_000_000)
    prepared = conv.prepare(TURN1)
    assert not prepared.compress
    d = conv.decide(prepared, None, uncompressed(prepared))
    assert (d.mode, d.reason, d.view) == ("off", "gate_declined", None)
    assert d.served_ids == prepared.input.prompt.ids


def test_raw_completion_has_no_view(smollm2_tokenizer):
    conv = Conversation(smollm2_tokenizer)
    ids = tuple(smollm2_tokenizer(_document() + "\n\n" + QUESTION)["input_ids"])
    prepared = prepare(
        CompressionRequest(RenderedPrompt("completion", tuple(ids), smollm2_tokenizer)),
        config=conv.config,
        target_tokenizer=smollm2_tokenizer,
        drafter_tokenizer=smollm2_tokenizer,
    )
    assert conv.decide(prepared, None).reason == "views_off"


# --------------------------------------------------------------------------- across vocabularies


def test_cross_vocabulary_drafter_continues_with_drafter_spans(smollm2_tokenizer, bpe_tokenizer):
    conv = Conversation(smollm2_tokenizer, drafter=bpe_tokenizer)
    *_, d1 = conv.turn(TURN1)
    assert d1.mode == "fresh"
    prepared, view, first, fresh, d = conv.turn(
        _reply(TURN1, "7318842.", "And the archive password?"), attend_to=(FACT,)
    )
    assert prepared.plan.n_tokens != len(prepared.input.prompt.ids)  # two vocabularies
    assert d.mode == "continue" and d.recalled_spans
    assert FACT in d.served_text
    assert d.served_ids[: d1.snapshot_cut] == d1.served_ids[: d1.snapshot_cut]


def test_served_result_carries_the_view_stats_in_the_api_shape(smollm2_tokenizer):
    conv = Conversation(smollm2_tokenizer)
    conv.turn(TURN1)
    messages = _agent_step(TURN1, "search(quokka)", "nothing new")
    prepared, view, first, fresh, d = conv.turn(messages)
    out = served_result(d, prepared, fresh)
    assert out.served_ids == d.served_ids and out.compressed
    assert out.stats["compress_ms"] == 0.0 and out.stats["compressed_tokens"] == len(d.served_ids)
    stats = PFlashStats(**out.stats)
    assert stats.view.mode == "continue" and stats.view.turn == 2
    assert stats.view.reused_tokens + stats.view.delta_tokens == stats.view.served_tokens


def _ratios(out) -> tuple:
    return tuple(out.stats[k] for k in ("served_ratio", "keep_ratio", "budget_ratio"))


@pytest.mark.parametrize(
    ("follow_up", "mode"),
    [
        (lambda turn1: turn1, "repeat"),
        (lambda turn1: _agent_step(turn1, "search(quokka)", "nothing new"), "continue"),
    ],
    ids=["repeat", "continue"],
)
def test_every_view_outcome_reports_the_served_share_and_the_requested_keep_ratio(
    smollm2_tokenizer, follow_up, mode
):
    """served_ratio (and its alias keep_ratio) is served / original target tokens whether
    the drafter ran (turn 1) or a view was served without it; budget_ratio is the keep ratio
    the request asked for (0.2), not the effective ratio with the pins."""
    conv = Conversation(smollm2_tokenizer)
    prepared, _, _, fresh, d1 = conv.turn(TURN1)
    first = served_result(d1, prepared, fresh)
    share = len(first.served_ids) / len(prepared.input.prompt.ids)
    assert d1.mode == "fresh" and share < 0.5
    assert _ratios(first) == (share, share, 0.2)
    prepared, _, _, fresh, d = conv.turn(follow_up(TURN1))
    out = served_result(d, prepared, fresh)
    assert (d.mode, fresh) == (mode, None)
    share = len(out.served_ids) / len(prepared.input.prompt.ids)
    assert _ratios(out) == (share, share, 0.2)
    assert PFlashStats(**out.stats).served_ratio == share


# --------------------------------------------------------------------------- helpers


def _ids(prepared, spans):
    ids = prepared.plan.drafter.ids
    return [t for s in spans for t in ids[s.begin : s.end]]


def _keys(conv, messages):
    return view_keys(conv.prepare(messages), conv.target)


def _recall_case(kept, lifts, **evidence):
    """A view holding [0, 50) of a 1000-token prompt whose new turn starts at 900, and a
    fresh selection keeping `kept` with candidate `lifts` and the given evidence spans."""
    import dataclasses

    from pflash.compress.pipeline import Compressed
    from pflash.views.records import View

    fields = {f.name: None for f in dataclasses.fields(View)}
    view = View(**{**fields, "spans": (Span(0, 50),), "drafter_gen_begin": 900})
    fresh = Compressed(
        compressed=True,
        served_ids=(),
        served_text="",
        kept_spans=kept,
        candidate_lifts=lifts,
        stats={},
        **evidence,
    )
    return view, fresh


def test_recall_brings_back_kept_lexical_evidence_whatever_its_attention_lift():
    """A follow-up naming a fact the view dropped: the fresh selection kept it as lexical
    evidence (it shares rare words with the question) though its attention lift is low."""
    import dataclasses

    from pflash.views.decision import recall_spans

    view, fresh = _recall_case(
        (Span(0, 50), Span(300, 320), Span(600, 664)),
        ((Span(300, 320), 1.1), (Span(600, 664), 3.0), (Span(0, 50), 5.0)),
        lexical_spans=(Span(300, 320),),
    )
    assert recall_spans(view, fresh, 1000, 2.0) == (Span(300, 320), Span(600, 664))
    no_lexical = dataclasses.replace(fresh, lexical_spans=())
    assert recall_spans(view, no_lexical, 1000, 2.0) == (Span(600, 664),)


def test_a_question_that_names_its_evidence_recalls_it_without_the_high_lift_lines():
    """ "What is MAX_RETRY_BUDGET set to?": the kept lexical unit the question names holds
    the answer; the high-lift lines around it (a test log's separators) are not recalled,
    the passage the evidence signals rank best still is. A question that names nothing
    (its lexical units share only plain words) keeps the high-lift lines."""
    import dataclasses

    from pflash.views.decision import recall_spans

    view, fresh = _recall_case(
        (Span(0, 50), Span(300, 320), Span(600, 664), Span(800, 830)),
        ((Span(300, 320), 1.1), (Span(600, 664), 3.0), (Span(0, 50), 5.0)),
        lexical_spans=(Span(300, 320),),
        named_spans=(Span(300, 320),),
        evidence_spans=(Span(800, 830),),
    )
    assert recall_spans(view, fresh, 1000, 2.0) == (Span(300, 320), Span(800, 830))
    plain = dataclasses.replace(fresh, named_spans=())
    assert recall_spans(view, plain, 1000, 2.0) == (Span(300, 320), Span(600, 664), Span(800, 830))


def test_recall_brings_back_the_passage_the_evidence_signals_rank_best():
    """A question in other words: the drafter's attention lift of its evidence is low and it
    shares no rare word, but the semantic signal ranks its passage best and the fresh
    selection kept it; recall brings back the kept part of that passage."""
    import dataclasses

    from pflash.compress.evidence.passage_evidence import PassageSignal, recalled_evidence
    from pflash.views.decision import recall_spans

    passages = (Span(100, 160), Span(300, 340), Span(400, 460), Span(600, 640))
    signal = PassageSignal(passages, np.array([0.0, 1.0, 0.95, 0.5]), 0.3)
    kept = (Span(0, 50), Span(310, 340), Span(600, 640))
    # the best passage (the second, within 0.9 of it, waits its turn): only its kept part
    assert recalled_evidence([signal], kept) == (Span(310, 340),)
    flat = PassageSignal(passages, np.array([0.0, 1.0, 0.5, 0.2]), 0.3)
    assert recalled_evidence([flat], (Span(0, 1000),)) == (Span(300, 340),)

    view, fresh = _recall_case(
        kept,
        ((Span(310, 340), 1.0), (Span(600, 640), 1.2), (Span(0, 50), 5.0)),
        evidence_spans=recalled_evidence([signal], kept),
    )
    assert recall_spans(view, fresh, 1000, 2.0) == (Span(310, 340),)
    assert recall_spans(view, dataclasses.replace(fresh, evidence_spans=()), 1000, 2.0) == ()


def test_a_question_in_other_words_recalls_the_best_kept_candidates_within_a_third():
    """ "Which partition moved elsewhere when its hold lapsed?" names nothing: its evidence
    (a log line) has a low lift and no signal ranks it best, but the fresh selection kept
    it. Recall takes the fresh selection's kept candidates outside the view, best first by
    selection score, while they fit a third of the fresh selection (one that does not fit
    is skipped), so the view is continued instead of rebuilt."""
    import dataclasses

    from pflash.views.decision import recall_spans

    kept = (Span(0, 50), Span(300, 320), Span(600, 640), Span(700, 730), Span(800, 860))
    lifts = ((Span(300, 320), 1.1), (Span(600, 640), 3.0), (Span(500, 530), 4.0))
    ranked = (Span(0, 50), Span(700, 730), Span(600, 640), Span(300, 320), Span(800, 860))
    view, fresh = _recall_case(kept, lifts, evidence_spans=(Span(600, 640),), ranked_spans=ranked)
    # 200 kept tokens: at most 66 recalled; the view's own 50 are not counted
    assert recall_spans(view, fresh, 1000, 2.0, asks=True) == (Span(300, 320), Span(700, 730))
    # without a ranking (a result built before it): all kept outside the view
    unranked = dataclasses.replace(fresh, ranked_spans=())
    assert recall_spans(view, unranked, 1000, 2.0, asks=True) == kept[1:]
    # a turn that asks nothing recalls the high-lift candidates and the signals' best only
    assert recall_spans(view, fresh, 1000, 2.0, asks=False) == (Span(500, 530), Span(600, 640))


def test_the_kept_candidates_are_ranked_by_their_mean_score():
    from pflash.compress.selection import Candidates, ranked_candidates

    cands = Candidates.of([(0, 4), (4, 6), (6, 10), (10, 12)], [0.0, 0.0, 0.0, 0.0])
    scores = np.array([1, 1, 1, 1, 5, 5, 0, 0, 0, 8, 2, 2], dtype=np.float64)
    # means: 1, 5, 2, 2; the last candidate is not kept; ties in position order
    assert ranked_candidates(cands, [0, 1, 2], scores) == (Span(4, 6), Span(6, 10), Span(0, 4))


@pytest.mark.parametrize(
    ("turn", "asks"),
    [
        ("Which partition moved elsewhere when its hold lapsed?", True),
        ("List the shards that were reassigned.", True),
        ("I ran the tests. Where did the build cache live again?", True),
        ("Thanks, that is all for now.", False),
        ("Okay, go on.", False),
        ("Are you sure?", False),
        ("Continue with the next step please.", False),
    ],
)
def test_a_turn_asks_when_it_holds_a_question(turn, asks):
    from pflash.compress.render.chat import Turn
    from pflash.views.decision import _asks

    text = f"<|im_start|>user\n{turn}<|im_end|>\n"
    b = text.index(turn)
    user = Turn("user", 0, 0, 0, 0, True, 0, b, b + len(turn), len(text))
    assert _asks(text, user) is asks
