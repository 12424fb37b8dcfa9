"""The compression flow (pflash.flow) end to end on real tokenizers with deterministic scorers.

The scorers here are test doubles of the drafter (pure functions of the token ids): they
put attention mass on the needle sentence's tokens, so what is asserted is the pipeline's
own work - plan, budget, candidates, selection, assembly, ceiling, stats, fail-closed.
"""

from __future__ import annotations

import numpy as np
import pytest

from pflash.compress.pipeline import CompressionRequest, prepare
from pflash.compress.render.chat import render_chat
from pflash.compress.render.rendered import RenderedPrompt
from pflash.compress.scoring import ScoreResult
from pflash.config import build_config
from pflash.errors import CompressionFailed
from pflash.flow.in_process import compress_in_process
from pflash.trace import TraceWriter, read_traces

NEEDLE = "The special magic quokka number is: 7318842."
QUESTION = "What is the special magic quokka number?"


def _document(chars: int = 12000) -> str:
    body = open("/usr/share/common-licenses/GPL-3").read()[:chars]
    mid = body.index("\n\n", len(body) // 2)
    return body[:mid] + "\n\n" + NEEDLE + body[mid:]


def _chat(tokenizer, system: str = "Answer briefly."):
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": _document() + "\n\n" + QUESTION},
    ]
    text = render_chat(tokenizer, messages)
    ids = tuple(tokenizer(text, add_special_tokens=False)["input_ids"])
    return messages, ids


def compress(
    inp: CompressionRequest, *, config, target_tokenizer, drafter_tokenizer, scorer, trace=None
):
    """The product flow (`pflash.flow.compressor`) in process for a planned-style input: views
    off (no store), the same prepare → score → finish the server runs."""
    return compress_in_process(
        inp.prompt,
        config,
        target_tokenizer=target_tokenizer,
        drafter_tokenizer=drafter_tokenizer,
        scorer=scorer,
        trace=trace,
        max_context=inp.max_context,
        max_output=inp.max_output,
        pflash_query=inp.pflash_query,
        pflash_required=inp.pflash_required,
    )


def needle_scorer(req, tokenizer_text):
    """Mass 1 spread over the tokens whose characters fall inside the needle, tiny elsewhere."""
    n = len(req.ids)
    begin = tokenizer_text.text.rindex(NEEDLE)
    end = begin + len(NEEDLE)
    mass = np.full(n, 1e-6, dtype=np.float32)
    for i, (b, e) in enumerate(tokenizer_text.offsets):
        if b < end and e > begin:
            mass[i] = 1.0
    mass[req.query.begin : req.query.end] = 0.0
    return ScoreResult(mass=mass / mass.sum(), scorer_new_tokens=n, scorer_forward_ms=1.0)


def _compress(tokenizer_t, tokenizer_d, cfg, messages, ids, **kw):
    holder = {}

    def scorer(req):
        prepared = holder["prepared"]
        return needle_scorer(req, prepared.plan.drafter)

    inp = CompressionRequest(
        RenderedPrompt("chat", tuple(ids), tokenizer_t, messages=messages),
        max_output=64,
        max_context=8192,
        **kw,
    )
    holder["prepared"] = prepare(
        inp, config=cfg, target_tokenizer=tokenizer_t, drafter_tokenizer=tokenizer_d
    )
    return compress(
        inp, config=cfg, target_tokenizer=tokenizer_t, drafter_tokenizer=tokenizer_d, scorer=scorer
    )


# the attention and lexical paths with drafter doubles (semantic evidence, on by default,
# has its own tests in test_passage_evidence.py and test_embedder.py)
CFG = dict(mode="always", keep_ratio=0.1, select_chunk_size=64, select_semantic_weight=0.0)


def test_the_kept_lexical_evidence_a_question_names_is_reported_for_recall(smollm2_tokenizer):
    # "quokka" and the number's line: the question names the needle's words; a question in
    # other words shares only plain words with the text and names nothing
    cfg = build_config(CFG, env={})
    messages, ids = _chat(smollm2_tokenizer)
    out = _compress(smollm2_tokenizer, smollm2_tokenizer, cfg, messages, ids)
    drafter = smollm2_tokenizer.decode
    named = [drafter(ids[s.begin : s.end]) for s in out.named_spans]
    assert any("quokka" in text for text in named)
    assert set(out.named_spans) <= set(out.lexical_spans)
    plain = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": _document() + "\n\nWhat may a person do with the work?"},
    ]
    text = render_chat(smollm2_tokenizer, plain)
    plain_ids = tuple(smollm2_tokenizer(text, add_special_tokens=False)["input_ids"])
    other = _compress(smollm2_tokenizer, smollm2_tokenizer, cfg, plain, plain_ids)
    assert other.named_spans == ()


def test_needle_question_and_generation_prompt_survive_compression(smollm2_tokenizer):
    cfg = build_config(CFG, env={})
    messages, ids = _chat(smollm2_tokenizer)
    out = _compress(smollm2_tokenizer, smollm2_tokenizer, cfg, messages, ids)
    assert out.compressed
    assert NEEDLE in out.served_text
    assert out.served_text.endswith(QUESTION + "<|im_end|>\n<|im_start|>assistant\n")
    assert out.served_text.startswith("<|im_start|>system\nAnswer briefly.<|im_end|>")
    assert len(out.served_ids) < 0.2 * len(ids)
    stats = out.stats
    assert stats["drafter_input_tokens"] == len(ids)
    assert out.original_tokens == len(ids)
    assert stats["compressed_tokens"] == len(out.served_ids)
    assert stats["query_rule"] == "prompt_end"
    # the ceiling: served tokens (minus the paragraph-join overhead) within floor(prompt * r)
    inp = CompressionRequest(
        RenderedPrompt("chat", tuple(ids), smollm2_tokenizer, messages=messages),
        max_output=64,
        max_context=8192,
    )
    budget = prepare(
        inp, config=cfg, target_tokenizer=smollm2_tokenizer, drafter_tokenizer=smollm2_tokenizer
    ).budget
    assert len(out.served_ids) <= budget.ceiling + 8
    assert stats["stop_reason"] in ("budget_reached", "candidates_exhausted")
    assert smollm2_tokenizer.decode(list(out.served_ids)) == out.served_text


def test_cross_vocabulary_drafter_keeps_the_needle(smollm2_tokenizer, bpe_tokenizer):
    cfg = build_config(CFG, env={})
    messages, ids = _chat(smollm2_tokenizer)
    out = _compress(smollm2_tokenizer, bpe_tokenizer, cfg, messages, ids)
    assert NEEDLE in out.served_text
    assert out.stats["drafter_input_tokens"] != len(ids)  # a different vocabulary
    assert out.served_text.endswith("<|im_start|>assistant\n")


def test_mode_off_serves_the_original_prompt(smollm2_tokenizer):
    cfg = build_config({**CFG, "mode": "off"}, env={})
    messages, ids = _chat(smollm2_tokenizer)
    out = _compress(smollm2_tokenizer, smollm2_tokenizer, cfg, messages, ids)
    assert not out.compressed and out.served_ids == ids and out.reason == "mode_off"
    assert _ratios(out) == (1.0, 1.0, None)  # nothing was compressed: no budget applied


def _ratios(out) -> tuple:
    return tuple(out.stats[k] for k in ("served_ratio", "keep_ratio", "budget_ratio"))


def test_fresh_stats_report_the_served_share_and_the_requested_keep_ratio(smollm2_tokenizer):
    """served_ratio (and its alias keep_ratio) is served / original target tokens, not the
    ratio over drafter tokens; budget_ratio is the request's keep ratio (0.2), not the
    effective ratio the pinned question raises."""
    cfg = build_config(CFG, env={}).with_request_overrides(keep_ratio=0.2)
    messages, ids = _chat(smollm2_tokenizer)
    out = _compress(smollm2_tokenizer, smollm2_tokenizer, cfg, messages, ids)
    share = len(out.served_ids) / len(ids)
    assert out.compressed and share < 0.5
    assert _ratios(out) == (share, share, 0.2)


def test_a_declined_gate_reports_the_whole_prompt_served_and_no_budget(smollm2_tokenizer):
    cfg = build_config({**CFG, "mode": "auto", "threshold": 100_000}, env={})
    messages, ids = _chat(smollm2_tokenizer)
    out = _compress(smollm2_tokenizer, smollm2_tokenizer, cfg, messages, ids)
    assert not out.compressed and _ratios(out) == (1.0, 1.0, None)


def test_auto_mode_skips_prompts_with_too_little_droppable_text(smollm2_tokenizer):
    cfg = build_config({**CFG, "mode": "auto", "threshold": 100_000}, env={})
    messages, ids = _chat(smollm2_tokenizer)
    out = _compress(smollm2_tokenizer, smollm2_tokenizer, cfg, messages, ids)
    assert not out.compressed and out.reason == "droppable_below_threshold"
    cfg = build_config({**CFG, "mode": "auto", "threshold": 1000}, env={})
    assert _compress(smollm2_tokenizer, smollm2_tokenizer, cfg, messages, ids).compressed


def test_scorer_crash_fails_closed_naming_the_drafter_stage(smollm2_tokenizer):
    cfg = build_config(CFG, env={})
    messages, ids = _chat(smollm2_tokenizer)

    def broken(req):
        raise RuntimeError("CUDA out of memory")

    inp = CompressionRequest(
        RenderedPrompt("chat", tuple(ids), smollm2_tokenizer, messages=messages)
    )
    with pytest.raises(CompressionFailed) as err:
        compress(
            inp,
            config=cfg,
            target_tokenizer=smollm2_tokenizer,
            drafter_tokenizer=smollm2_tokenizer,
            scorer=broken,
        )
    assert err.value.stage == "drafter" and "out of memory" in str(err.value)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_scores_fail_closed(smollm2_tokenizer, bad):
    cfg = build_config(CFG, env={})
    messages, ids = _chat(smollm2_tokenizer)

    def scorer(req):
        mass = np.full(len(req.ids), 1.0 / len(req.ids), dtype=np.float32)
        mass[3] = bad
        return ScoreResult(mass=mass)

    inp = CompressionRequest(
        RenderedPrompt("chat", tuple(ids), smollm2_tokenizer, messages=messages)
    )
    with pytest.raises(CompressionFailed) as err:
        compress(
            inp,
            config=cfg,
            target_tokenizer=smollm2_tokenizer,
            drafter_tokenizer=smollm2_tokenizer,
            scorer=scorer,
        )
    assert err.value.stage == "drafter"


def test_wrong_length_scores_fail_closed(smollm2_tokenizer):
    cfg = build_config(CFG, env={})
    messages, ids = _chat(smollm2_tokenizer)
    inp = CompressionRequest(
        RenderedPrompt("chat", tuple(ids), smollm2_tokenizer, messages=messages)
    )
    with pytest.raises(CompressionFailed) as err:
        compress(
            inp,
            config=cfg,
            target_tokenizer=smollm2_tokenizer,
            drafter_tokenizer=smollm2_tokenizer,
            scorer=lambda req: ScoreResult(mass=np.ones(5, dtype=np.float32) / 5),
        )
    assert err.value.stage == "drafter"


def test_selection_trace_records_the_served_selection(smollm2_tokenizer, tmp_path):
    cfg = build_config({**CFG, "trace_path": str(tmp_path / "t.jsonl")}, env={})
    messages, ids = _chat(smollm2_tokenizer)
    writer = TraceWriter(cfg.trace_path)
    inp = CompressionRequest(
        RenderedPrompt("chat", tuple(ids), smollm2_tokenizer, messages=messages)
    )
    prepared = prepare(
        inp, config=cfg, target_tokenizer=smollm2_tokenizer, drafter_tokenizer=smollm2_tokenizer
    )
    out = compress(
        inp,
        config=cfg,
        target_tokenizer=smollm2_tokenizer,
        drafter_tokenizer=smollm2_tokenizer,
        scorer=lambda req: needle_scorer(req, prepared.plan.drafter),
        trace=writer,
    )
    writer.close()
    (rec,) = read_traces(cfg.trace_path)
    assert rec.schema_version == 3
    assert rec.input_tokens == len(ids)
    assert list(rec.compressed_ids) == [
        t for s in out.kept_spans for t in prepared.plan.drafter.ids[s.begin : s.end]
    ]
    assert rec.retained_tokens == sum(len(s) for s in out.kept_spans)
    forced = {i for i, f in enumerate(rec.forced_chunks) if f}
    assert forced and forced <= set(rec.selected_chunks)
    assert len(rec.chunk_scores) == len(rec.segments) == out.stats["segments"]


def test_legacy_selector_keeps_the_question(smollm2_tokenizer):
    cfg = build_config({"mode": "always", "keep_ratio": 0.1, "select_mode": "legacy"}, env={})
    messages, ids = _chat(smollm2_tokenizer)

    def scorer(req):
        assert req.scorer == "legacy"
        rng = np.random.default_rng(0)
        return ScoreResult(mass=None, legacy=rng.random(len(req.ids)).astype(np.float32))

    out = compress(
        CompressionRequest(
            RenderedPrompt("chat", tuple(ids), smollm2_tokenizer, messages=messages)
        ),
        config=cfg,
        target_tokenizer=smollm2_tokenizer,
        drafter_tokenizer=smollm2_tokenizer,
        scorer=scorer,
    )
    assert out.compressed and QUESTION in out.served_text
    assert len(out.served_ids) < 0.5 * len(ids)
    share = len(out.served_ids) / len(ids)
    assert _ratios(out) == (share, share, 0.1)  # served share, not the legacy r0 again


@pytest.mark.parametrize(
    ("stage", "choice", "action"),
    [
        ("drafter", "bypass", "bypass"),
        ("drafter", "fail", "fail"),
        ("probe", "bypass", "bypass"),
        ("probe", "fail", "fail"),
        ("selection", "bypass", "fail"),
        ("ceiling", "bypass", "fail"),
        ("query_mapping", "bypass", "fail"),
    ],
)
def test_only_scoring_failures_may_bypass_and_only_when_the_operator_chose_it(
    stage, choice, action
):
    from pflash.compress.pipeline import scorer_failure_action

    assert (
        scorer_failure_action(stage, build_config({"on_drafter_error": choice}, env={})) == action
    )


def test_a_prompt_that_is_only_the_question_is_served_as_is(smollm2_tokenizer):
    cfg = build_config(CFG, env={})
    ids = tuple(smollm2_tokenizer("Hello there", add_special_tokens=False)["input_ids"])

    def never(req):
        raise AssertionError("the drafter must not run")

    out = compress(
        CompressionRequest(RenderedPrompt("completion", tuple(ids), smollm2_tokenizer)),
        config=cfg,
        target_tokenizer=smollm2_tokenizer,
        drafter_tokenizer=smollm2_tokenizer,
        scorer=never,
    )
    assert not out.compressed and out.served_ids == ids
    assert out.reason in ("prompt_too_short", "nothing_to_drop")


# ---------------------------------------------------------------------------- lexical evidence


def _decoy_scorer(decoy: str):
    """Attention that favours the wrong text: all mass on the characters of `decoy`."""

    def scorer(req, drafter):
        begin = drafter.text.index(decoy)
        end = begin + len(decoy)
        mass = np.full(len(req.ids), 1e-6, dtype=np.float32)
        for i, (b, e) in enumerate(drafter.offsets):
            if b < end and e > begin:
                mass[i] = 1.0
        mass[req.query.begin : req.query.end] = 0.0
        return ScoreResult(mass=mass / mass.sum())

    return scorer


def _compress_with(tokenizer, cfg, content, scorer, trace=None):
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": content},
    ]
    ids = tuple(tokenizer(render_chat(tokenizer, messages), add_special_tokens=False)["input_ids"])
    inp = CompressionRequest(
        RenderedPrompt("chat", tuple(ids), tokenizer, messages=messages),
        max_output=64,
        max_context=8192,
    )
    prepared = prepare(inp, config=cfg, target_tokenizer=tokenizer, drafter_tokenizer=tokenizer)
    return compress(
        inp,
        config=cfg,
        target_tokenizer=tokenizer,
        drafter_tokenizer=tokenizer,
        scorer=lambda req: scorer(req, prepared.plan.drafter),
        trace=trace,
    )


def test_a_chat_of_one_empty_system_message_is_served_as_is_not_a_500(smollm2_tokenizer):
    """No user message and nothing in the last one to locate: the question is empty, the
    prompt is served whole (found by the fuzz suite as a query_mapping failure, a 500)."""
    from pflash.flow.request import render_request
    from pflash.serving.chat_completion.serving import parse_chat_request

    cfg = build_config({**CFG, "mode": "always"}, env={})
    chat = parse_chat_request({"messages": [{"role": "system", "content": ""}], "max_tokens": 2})
    prompt = render_request(chat, "chat", smollm2_tokenizer)

    def never(req):
        raise AssertionError("the drafter must not run")

    out = compress(
        CompressionRequest(prompt, max_output=2),
        config=cfg,
        target_tokenizer=smollm2_tokenizer,
        drafter_tokenizer=smollm2_tokenizer,
        scorer=never,
    )
    assert not out.compressed and out.served_ids == prompt.ids


def test_lexical_evidence_keeps_the_needle_attention_misses(smollm2_tokenizer):
    doc = _document()
    decoy = doc[:3000]  # ~650 drafter tokens, more than the whole droppable budget
    content = doc + "\n\n" + QUESTION
    off = _compress_with(
        smollm2_tokenizer,
        build_config({**CFG, "select_lexical": "off"}, env={}),
        content,
        _decoy_scorer(decoy),
    )
    assert NEEDLE not in off.served_text
    assert "lexical_units" not in off.stats
    for mode in ("anchors", "cascade"):
        cfg = build_config({**CFG, "select_lexical": mode}, env={})
        on = _compress_with(smollm2_tokenizer, cfg, content, _decoy_scorer(decoy))
        assert NEEDLE in on.served_text, mode
        assert on.stats["lexical_units"] >= 1 and on.stats["lexical_kept"] >= 1
        assert len(on.served_ids) <= int(len(off.served_ids) * 1.1)
        assert on.served_text.endswith(QUESTION + "<|im_end|>\n<|im_start|>assistant\n")


def test_lexical_evidence_keeps_a_question_asked_before_the_document(smollm2_tokenizer):
    doc = _document()
    content = QUESTION + "\n\n" + doc
    scorer = _decoy_scorer(doc[4000:7000])
    off_cfg = build_config({**CFG, "select_lexical": "off"}, env={})
    off = _compress_with(smollm2_tokenizer, off_cfg, content, scorer)
    assert NEEDLE not in off.served_text
    cfg = build_config({**CFG, "select_lexical": "anchors"}, env={})
    on = _compress_with(smollm2_tokenizer, cfg, content, scorer)
    assert QUESTION in on.served_text and NEEDLE in on.served_text


def test_many_anchored_units_are_cut_at_the_budget(smollm2_tokenizer, tmp_path):
    codes = [f"QX{7000 + 37 * i}" for i in range(60)]
    lines = [f"Entry {c} belongs to the archive shelf number {i}." for i, c in enumerate(codes)]
    content = (
        _document() + "\n" + "\n".join(lines) + "\n\nWhich shelves hold " + " ".join(codes) + "?"
    )
    cfg = build_config(
        {
            **CFG,
            "select_lexical": "anchors",
            "anchor_query_tokens": 512,  # the whole list of codes is the question
            "trace_path": str(tmp_path / "t.jsonl"),
        },
        env={},
    )
    writer = TraceWriter(cfg.trace_path)
    out = _compress_with(smollm2_tokenizer, cfg, content, _decoy_scorer(content[:2000]), writer)
    writer.close()
    (rec,) = read_traces(cfg.trace_path)
    assert out.stats["lexical_units"] >= len(codes)
    assert 0 < out.stats["lexical_kept"] < out.stats["lexical_units"]
    assert rec.retained_tokens <= rec.token_budget
    assert len(rec.chunk_scores) == len(rec.segments) == out.stats["segments"]
    forced = {i for i, f in enumerate(rec.forced_chunks) if f}
    assert forced <= set(rec.selected_chunks)


def test_lexical_share_leaves_room_for_attention(smollm2_tokenizer):
    doc = _document()
    decoy = doc[:3000]
    content = doc + "\n\n" + QUESTION
    kept = {}
    for share in (1.0, 0.05):
        cfg = build_config({**CFG, "select_lexical": "anchors", "lexical_max_share": share}, env={})
        out = _compress_with(smollm2_tokenizer, cfg, content, _decoy_scorer(decoy))
        kept[share] = (out.stats["lexical_kept"], NEEDLE in out.served_text)
    # 5% of the droppable budget is less than the needle sentence: attention keeps the rest
    assert kept[1.0][1] and not kept[0.05][1]
    assert kept[0.05][0] < kept[1.0][0]


RECENCY = 0.1  # mass scale of the recency band: 1/distance from the question


def _recency_scorer(req, drafter):
    """A small drafter's habit: a sink, a 1/distance recency band, and the needle at 3x its
    neighbours — less mass than the chunks just before the question."""
    n, q = len(req.ids), req.query.begin
    j = np.arange(n)
    mass = 1e-4 + RECENCY / np.maximum(q - j, 1)
    mass[0] = 0.5
    begin = drafter.text.rindex(NEEDLE)
    end = begin + len(NEEDLE)
    for i, (b, e) in enumerate(drafter.offsets):
        if b < end and e > begin:
            mass[i] *= 3.0
    mass[q:] = 0.0
    return ScoreResult(mass=(mass / mass.sum()).astype(np.float32))


def test_position_prior_lets_the_needle_outrank_the_recency_band(smollm2_tokenizer):
    content = _document() + "\n\n" + QUESTION
    attention_only = {**CFG, "select_lexical": "off"}
    raw_cfg = build_config({**attention_only, "select_position_prior": "off"}, env={})
    raw = _compress_with(smollm2_tokenizer, raw_cfg, content, _recency_scorer)
    assert NEEDLE not in raw.served_text
    cfg = build_config({**attention_only, "select_position_prior": "distance"}, env={})
    lifted = _compress_with(smollm2_tokenizer, cfg, content, _recency_scorer)
    assert NEEDLE in lifted.served_text
    assert lifted.stats["kept_tokens"] <= raw.stats["kept_tokens"] + 64
