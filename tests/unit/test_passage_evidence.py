"""Passage evidence in strict selection (pflash/compress/evidence/passage_evidence.py).

The pure steps on real drafter text (passages, the question, the mix), then the product flow
with deterministic scorers that stand in for the drafter's signals: attention on a decoy and
a passage signal (semantic or projection) on the passage holding the evidence. What is asserted is the pipeline's
own work: what it asks the drafter for, how it mixes, and that it fails closed.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest

from pflash.compress.evidence.framing import framing_lines
from pflash.compress.evidence.passage_evidence import (
    PassageSignal,
    combine_questions,
    evidence_passages,
    evidence_question,
    evidence_request,
    lift_code_headers,
    mix_evidence,
    passage_cuts,
    passage_signals,
    passage_texts,
    passage_token_scores,
    question_parts,
    whole_sentences,
)
from pflash.compress.pipeline import CompressionRequest, prepare
from pflash.compress.render.chat import render_chat
from pflash.compress.render.rendered import RenderedPrompt
from pflash.compress.scoring import ScoreResult
from pflash.compress.text.code_headers import code_lines
from pflash.compress.text.encoding import encode_as_written_with_offsets
from pflash.config import build_config
from pflash.errors import CompressionFailed
from pflash.flow.in_process import compress_in_process
from pflash.spans import Span, subtract

# the evidence and a question that shares no content word with it
EVIDENCE = "Tenants of the Sorvux towers lodge 1152 credits up front, returned when they move out."
QUESTION = "What amount is held back against possible harm to the property?"
CFG = dict(
    mode="always",
    keep_ratio=0.1,
    select_chunk_size=64,
    select_lexical="off",
    select_semantic_weight=0.0,  # each test turns on the signal it is about
)


def _content(chars: int = 12000) -> str:
    body = open("/usr/share/common-licenses/GPL-3").read()[:chars]
    mid = body.index("\n\n", len(body) // 2)
    return body[:mid] + "\n\n" + EVIDENCE + body[mid:] + "\n\n" + QUESTION


def _messages(content: str | None = None) -> list[dict]:
    return [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": content or _content()},
    ]


def _prepared(tokenizer, cfg, content: str | None = None):
    messages = _messages(content)
    ids = tuple(tokenizer(render_chat(tokenizer, messages), add_special_tokens=False)["input_ids"])
    inp = CompressionRequest(
        RenderedPrompt("chat", tuple(ids), tokenizer, messages=messages),
        max_output=64,
        max_context=8192,
    )
    return inp, prepare(inp, config=cfg, target_tokenizer=tokenizer, drafter_tokenizer=tokenizer)


# ------------------------------------------------------------------------- pure steps


def test_passages_tile_the_context_outside_pins_within_the_length(smollm2_tokenizer):
    text = _content(6000)
    drafter = encode_as_written_with_offsets(smollm2_tokenizer, text)
    end = drafter.token_at_or_after(text.index(QUESTION))
    pinned = (Span(0, 5), Span(300, 340))
    passages = evidence_passages(drafter, end, pinned, max_tokens=96)
    assert passages == tuple(sorted(passages))
    assert subtract([Span(0, end)], pinned) == subtract(passages, [])  # tiled, no gap
    assert all(0 < len(p) <= 96 for p in passages)
    assert not any(p.overlaps(q) for p in passages for q in pinned)
    # cut at sentence and line starts: the evidence sentence lies inside one passage
    ev = text.index(EVIDENCE)
    holding = [p for p in passages if drafter.char_span(p)[0] <= ev < drafter.char_span(p)[1]]
    (p,) = holding
    assert drafter.char_span(p)[1] >= ev + len(EVIDENCE)


def test_regions_an_earlier_turn_cut_are_reused_only_where_text_and_tokens_are_unchanged(
    smollm2_tokenizer,
):
    """A conversation's next turn: the regions whose bounds, text and token offsets are the
    earlier turn's come from its table, and the passages equal cutting every region again;
    a region whose text changed (same bounds) is cut again."""
    text = _content(6000)
    drafter = encode_as_written_with_offsets(smollm2_tokenizer, text)
    end = drafter.token_at_or_after(text.index(QUESTION))
    pinned = (Span(0, 5), Span(300, 340))
    made: dict = {}
    first = evidence_passages(drafter, end, pinned, max_tokens=96, made=made)
    assert len(made) == 2  # the regions between the pins and after them
    later = text + "\n\nAnd one more line the next turn added."
    drafter2 = encode_as_written_with_offsets(smollm2_tokenizer, later)
    end2 = drafter2.token_at_or_after(len(later) - 10)
    calls = []
    import pflash.compress.evidence.passage_evidence as pe

    real = pe._cut_region
    try:
        pe._cut_region = lambda d, r, m: calls.append(r) or real(d, r, m)
        made2: dict = {}
        reused = evidence_passages(drafter2, end2, pinned, max_tokens=96, known=made, made=made2)
    finally:
        pe._cut_region = real
    assert reused == evidence_passages(drafter2, end2, pinned, max_tokens=96)
    head = len(next(iter(made.values())))  # the passages of the region between the pins
    assert reused[:head] == first[:head]
    assert calls == [Span(340, end2)]  # only the region that grew was cut
    # the same bounds over other text: cut again
    edited = "X" + text[1:]
    drafter3 = encode_as_written_with_offsets(smollm2_tokenizer, edited)
    assert evidence_passages(drafter3, end, pinned, max_tokens=96, known=made) == (
        evidence_passages(drafter3, end, pinned, max_tokens=96)
    )


def test_a_sentence_longer_than_a_passage_is_cut_in_parts(smollm2_tokenizer):
    text = "word " * 500 + "\n\n" + QUESTION
    drafter = encode_as_written_with_offsets(smollm2_tokenizer, text)
    end = drafter.token_at_or_after(text.index(QUESTION))
    passages = evidence_passages(drafter, end, (), max_tokens=64)
    assert [len(p) for p in passages[:-1]] == [64] * (len(passages) - 1)
    assert passages[0].begin == 0 and passages[-1].end == end


def test_the_question_is_the_one_closing_the_user_turn_not_the_template(smollm2_tokenizer):
    _, prepared = _prepared(smollm2_tokenizer, build_config(CFG, env={}))
    plan = prepared.plan
    q = evidence_question(plan)
    assert plan.drafter.text[slice(*plan.drafter.char_span(q))].strip() == QUESTION
    assert len(plan.query) == 1  # the main window is the generation prompt's last token


def test_token_scores_keep_passages_above_the_median_gain():
    passages = (Span(0, 2), Span(2, 5), Span(5, 6))
    out = passage_token_scores(8, passages, np.array([0.1, 0.5, 0.3]))
    assert out.tolist() == pytest.approx([0, 0, 0.2, 0.2, 0.2, 0, 0, 0])


def test_mix_weights_normalised_signals_and_leaves_the_question():
    passages = (Span(0, 2), Span(2, 4))
    attention = np.array([3.0, 1.0, 0.0, 0.0, 7.0])
    gains = np.array([0.0, 1.0])

    def mix(*weights):
        signals = [PassageSignal(passages, gains, w) for w in weights]
        return mix_evidence(attention, signals, context_end=4).tolist()

    assert mix() == pytest.approx([0.75, 0.25, 0, 0, 7.0])
    assert mix(0.0) == pytest.approx([0.75, 0.25, 0, 0, 7.0])
    assert mix(1.0) == pytest.approx([0, 0, 0.5, 0.5, 7.0])
    assert mix(0.5) == pytest.approx([0.375, 0.125, 0.25, 0.25, 7.0])
    assert mix(0.25, 0.25) == pytest.approx(mix(0.5))  # two signals add their weights
    # a signal on other passages: each keeps its own spread
    other = PassageSignal((Span(0, 1), Span(1, 4)), np.array([2.0, 0.0]), 0.5)
    both = mix_evidence(attention, [PassageSignal(passages, gains, 0.5), other], context_end=4)
    assert both.tolist() == pytest.approx([0.5, 0, 0.25, 0.25, 7.0])


def test_mix_refuses_gains_that_do_not_match_the_passages():
    with pytest.raises(ValueError, match="2 passage scores for 3 passages"):
        passage_token_scores(9, (Span(0, 3), Span(3, 6), Span(6, 9)), np.zeros(2))


def test_a_question_of_several_sentences_is_compared_whole_and_part_by_part():
    one = "What amount is held back against possible harm to the property?"
    assert question_parts(one) == (one,)
    many = "About the firm: When was it founded? Where is it based?\nTell me its owner."
    assert question_parts(many) == (
        many,
        "About the firm: When was it founded?",
        "Where is it based?",
        "Tell me its owner.",
    )
    requests = "List the founders.\nGive the headcount."  # nothing asks with "?": all parts
    assert question_parts(requests) == (requests, "List the founders.", "Give the headcount.")


def test_an_instruction_after_the_question_is_not_compared():
    asked = "Which routine shown above converts hue into red? Answer with that routine alone."
    assert question_parts(asked) == ("Which routine shown above converts hue into red?",)
    many = "About the firm: When was it founded? Where is it based?\nAnswer briefly."
    assert question_parts(many) == (
        "About the firm: When was it founded? Where is it based?",
        "About the firm: When was it founded?",
        "Where is it based?",
    )
    twice = "Is it red? Is it red? Please reply: yes or no."  # cut after the last "?"
    assert question_parts(twice) == ("Is it red? Is it red?", "Is it red?", "Is it red?")
    alone = "Answer briefly."  # nothing asks: nothing is left out
    assert question_parts(alone) == (alone,)


def test_each_question_part_ranks_its_own_best_passage_first():
    money = [0.60, 0.55, 0.50, 0.20]  # a part close to every passage with a number
    founder = [0.10, 0.12, 0.11, 0.30]  # a part whose answer scores low in raw cosine
    combined = combine_questions(np.array([money, founder]))
    assert combined.tolist() == pytest.approx([1.0, 0.025 / 0.075, 0.0, 1.0])
    assert int(np.argmin(np.max([money, founder], axis=0))) == 3  # raw max ranks it last
    one = np.array([[0.3, 0.9, 0.1, 0.5, 0.7]])
    top = combine_questions(one)  # one part: the cosine's order above the median
    assert top.tolist() == pytest.approx([0.0, 1.0, 0.0, 0.0, 0.5])


CODE = (
    "Some prose before the code.\n"
    "def shorten(text, width):\n"
    '    """Cut a long paragraph down to a size limit."""\n'
    "    return text[:width]\n"
    "\n"
    "class Box:\n"
    "    def open(self):\n"
    "        return 1\n"
    "plain text after\n"
)


def test_code_lines_map_each_body_line_to_its_innermost_header():
    starts, headers = code_lines(CODE, 0, len(CODE))
    line = {CODE[b:].split("\n", 1)[0].strip(): h for b, h in zip(starts, headers, strict=True)}
    at = CODE.index
    assert line["Some prose before the code."] == -1
    assert line["def shorten(text, width):"] == -1
    assert line['"""Cut a long paragraph down to a size limit."""'] == at("def shorten")
    assert line["return text[:width]"] == at("def shorten")
    assert line["def open(self):"] == at("class Box")
    assert line["return 1"] == at("    def open")
    assert line["plain text after"] == -1


def test_a_def_line_scores_as_high_as_the_docstring_that_matches_the_question(smollm2_tokenizer):
    drafter = encode_as_written_with_offsets(smollm2_tokenizer, CODE)
    passages = evidence_passages(drafter, len(drafter), [], max_tokens=12)
    texts = [drafter.text[slice(*drafter.char_span(p))] for p in passages]
    doc = next(i for i, t in enumerate(texts) if "paragraph" in t)
    head = next(i for i, t in enumerate(texts) if "def shorten" in t)
    assert doc != head
    values = np.zeros(len(passages))
    values[doc] = 0.8
    lifted = lift_code_headers(drafter, passages, values)
    assert lifted[head] == pytest.approx(0.8) and lifted[doc] == pytest.approx(0.8)
    assert np.count_nonzero(lifted) == 2  # nothing else moves
    prose = encode_as_written_with_offsets(smollm2_tokenizer, _content()[:2000])
    ps = evidence_passages(prose, len(prose), [], max_tokens=24)
    v = np.random.default_rng(0).random(len(ps))
    assert lift_code_headers(prose, ps, v).tolist() == v.tolist()  # prose is unchanged


def test_the_parts_of_a_sentence_cut_in_passages_all_score_its_best_part(smollm2_tokenizer):
    long = (
        "Tenants of the Sorvux towers lodge 1152 credits up front, returned when they move"
        " out of the building at the end of the lease if nothing in the flat was damaged."
    )
    text = "A short line.\n" + long + " Another sentence follows here.\nLast line."
    drafter = encode_as_written_with_offsets(smollm2_tokenizer, text)
    passages = evidence_passages(drafter, len(drafter), [], max_tokens=12)
    texts = [drafter.text[slice(*drafter.char_span(p))] for p in passages]
    parts = [i for i, t in enumerate(texts) if t.strip() and t.strip() in long]
    assert len(parts) >= 2  # the long sentence was cut
    values = np.zeros(len(passages))
    values[parts[0]] = 0.9  # the part naming the towers matched
    out = whole_sentences(drafter, passages, values)
    assert out[parts].tolist() == [0.9] * len(parts)
    last = next(i for i, t in enumerate(texts) if "Last line" in t)
    assert out[last] == 0.0  # a new line is a new sentence
    assert out[0] == 0.0  # so is the line before


def test_passage_cuts_are_every_bound_of_every_signal():
    a = PassageSignal((Span(0, 5), Span(5, 9)), np.zeros(2), 0.5)
    b = PassageSignal((Span(3, 9),), np.zeros(1), 0.5)
    assert passage_cuts([a, b]).tolist() == [0, 3, 5, 9]


def test_the_embedder_reads_a_body_piece_after_its_def_line(smollm2_tokenizer):
    drafter = encode_as_written_with_offsets(smollm2_tokenizer, CODE)
    passages = evidence_passages(drafter, len(drafter), [], max_tokens=12)
    plain = [drafter.text[slice(*drafter.char_span(p))] for p in passages]
    read = passage_texts(drafter, passages)
    checked = set()
    for piece, text in zip(plain, read, strict=True):
        first = piece.lstrip()
        if first.startswith(("return text", '"""Cut')):
            assert text == "def shorten(text, width):\n" + piece
        elif first.startswith("return 1"):
            assert text == "def open(self):\n" + piece  # the innermost block
        elif first.startswith(("Some prose", "def shorten", "plain text")):
            assert text == piece  # outside a block, or holding its header
        else:
            continue
        checked.add(first[:6])
    assert len(checked) >= 3


RAG_INSTRUCTION = (
    "Answer the question based on the given documents. Only give me the answer and do not "
    "output any other words."
)


def _rag_content(question: str = QUESTION) -> str:
    """Documents under "Document N:" labels, the instruction before and after them, then
    the question: the layout of RULER's QA prompts and of many RAG templates."""
    paras = [p for p in open("/usr/share/common-licenses/GPL-3").read()[:9000].split("\n\n")]
    docs = [f"Document {i + 1}:\n{p.strip()}" for i, p in enumerate(paras) if p.strip()]
    docs.insert(len(docs) // 2, f"Document {len(docs) + 1}:\n{EVIDENCE}")
    return "\n\n".join(
        [RAG_INSTRUCTION, "The following are given documents.", *docs, RAG_INSTRUCTION,
         f"Question: {question} Answer:"]
    )  # fmt: skip


def test_framing_lines_are_labels_and_instructions_on_the_answer():
    text = (
        "Answer the question based on the given documents. Only give me the answer.\n"
        "Document 1:\nContext:\n  Passage [2]:  \nTitle: Rhine\nAnswer: 42\n"
        "Answer briefly.\nRespond to all inquiries within 24 hours.\n"
        "Please reply to the question in one word.\nelse:\n    def parse(self):\n"
        "The bridge was finished in 1871.\n"
    )
    found = [text[b:e] for b, e in framing_lines(text)]
    assert found == [
        "Answer the question based on the given documents. Only give me the answer.",
        "Document 1:",
        "Context:",
        "Passage [2]:",
        "Please reply to the question in one word.",
    ]
    assert framing_lines(text, text.index("Title")) == [
        (text.index("Please"), text.index("\nelse"))
    ]


def test_document_labels_and_instructions_are_not_scored_as_passages(smollm2_tokenizer):
    # the tap projection ranked RULER's "Document N:" labels and its instruction first for
    # any question; no signal scores them now, and every document sentence is still a passage
    cfg = build_config(
        {**CFG, "select_semantic_weight": 0.5, "select_projection_weight": 0.5}, env={}
    )
    _, prepared = _prepared(smollm2_tokenizer, cfg, _rag_content())
    req = evidence_request(prepared.plan, prepared.budget.pinned, cfg, suffix=False)
    drafter = prepared.plan.drafter
    texts = [drafter.text[slice(*drafter.char_span(p))] for p in req["projection_passages"]]
    assert req["semantic_passages"] == req["projection_passages"]
    assert not any(re.search(r"Document \d+:", t) for t in texts)
    assert not any("Answer the question" in t or "Only give me" in t for t in texts)
    assert sum(EVIDENCE in t for t in texts) == 1
    assert any("The following are given documents." in t for t in texts)
    assert sum(len(t) for t in texts) > 0.8 * len(_rag_content())


# ------------------------------------------------------------------------- the flow


def _decoy(decoy: str):
    """Attention on `decoy` (more text than the budget), next to nothing elsewhere."""

    def scorer(req, drafter):
        begin = drafter.text.index(decoy)
        mass = np.full(len(req.ids), 1e-6, dtype=np.float32)
        for i, (b, e) in enumerate(drafter.offsets):
            if b < begin + len(decoy) and e > begin:
                mass[i] = 1.0
        mass[req.query.begin :] = 0.0
        return ScoreResult(mass=mass / mass.sum())

    return scorer


def _compress(tokenizer, cfg, scorer, content: str | None = None):
    inp, prepared = _prepared(tokenizer, cfg, content)
    prompt = inp.prompt
    asked = []

    def score(req):
        asked.append(req)
        return scorer(req, prepared.plan.drafter)

    out = compress_in_process(
        prompt,
        cfg,
        target_tokenizer=tokenizer,
        drafter_tokenizer=tokenizer,
        scorer=score,
        max_context=8192,
        max_output=64,
    )
    return out, asked[0]


def test_evidence_off_asks_nothing_and_attention_keeps_the_decoy(smollm2_tokenizer):
    decoy = _content()[:3000]
    out, req = _compress(smollm2_tokenizer, build_config(CFG, env={}), _decoy(decoy))
    assert req.semantic_passages == () and req.projection_passages == ()
    assert EVIDENCE not in out.served_text


def _decoy_and_semantic(decoy: str, semantic="per_text"):
    """Attention on `decoy`; cosine 0.9 for the passage text holding the evidence's first
    words, 0.1 for the others; `semantic` may break the reply: None (no reply), "short" (one
    passage missing) or "nan" (a non-finite cosine)."""

    def scorer(req, drafter):
        base = _decoy(decoy)(req, drafter)
        if semantic is None:
            return base
        sims = np.array(
            [[0.9 if "Sorvux" in t else 0.1 for t in req.semantic_texts]]
            * len(req.semantic_questions),
            dtype=np.float32,
        )
        if semantic == "short":
            sims = sims[:, 1:]
        elif semantic == "nan":
            sims[0, 0] = np.nan
        return ScoreResult(mass=base.mass, semantic=sims)

    return scorer


def test_semantic_evidence_sends_sentence_passages_and_keeps_the_answer(smollm2_tokenizer):
    decoy = _content()[:3000]
    cfg = build_config({**CFG, "select_semantic_weight": 1.0}, env={})
    out, req = _compress(smollm2_tokenizer, cfg, _decoy_and_semantic(decoy))
    assert req.semantic_questions == (QUESTION,)  # one sentence: the question alone
    assert req.projection_passages == ()  # only what was asked for
    assert sum("Sorvux" in t for t in req.semantic_texts) == 1
    assert any(t.strip() == EVIDENCE for t in req.semantic_texts)  # one sentence, one passage
    assert EVIDENCE in out.served_text
    assert out.stats["segments"] > 0


@pytest.mark.parametrize(
    ("semantic", "message"),
    [(None, "none returned"), ("short", "returned"), ("nan", "non-finite")],
)
def test_a_missing_or_bad_semantic_reply_fails_closed(smollm2_tokenizer, semantic, message):
    cfg = build_config({**CFG, "select_semantic_weight": 0.5}, env={})
    scorer = _decoy_and_semantic(_content()[:3000], semantic=semantic)
    with pytest.raises(CompressionFailed, match=message) as err:
        _compress(smollm2_tokenizer, cfg, scorer)
    assert err.value.stage == "drafter"


def _decoy_and_projection(decoy: str, projection="per_passage"):
    """Attention on `decoy`; projection cosine 0.9 for the passage holding the evidence's
    first words, 0.1 for the others (or no reply, or one value short)."""

    def scorer(req, drafter):
        base = _decoy(decoy)(req, drafter)
        texts = [drafter.text[slice(*drafter.char_span(p))] for p in req.projection_passages]
        sims = np.array([0.9 if "Sorvux" in t else 0.1 for t in texts], dtype=np.float32)
        if projection is None:
            sims = None
        elif projection == "short":
            sims = sims[:-1]
        return ScoreResult(mass=base.mass, projection=sims)

    return scorer


def test_projection_evidence_asks_for_passages_and_the_question_and_keeps_the_answer(
    smollm2_tokenizer,
):
    decoy = _content()[:3000]
    cfg = build_config(
        {**CFG, "select_semantic_weight": 0.0, "select_projection_weight": 1.0}, env={}
    )
    out, req = _compress(smollm2_tokenizer, cfg, _decoy_and_projection(decoy))
    drafter = encode_as_written_with_offsets(
        smollm2_tokenizer, smollm2_tokenizer.decode(list(req.ids))
    )
    question = drafter.text[slice(*drafter.char_span(req.projection_question))]
    assert question.strip() == QUESTION
    assert req.semantic_texts == ()  # only what was asked
    assert len(req.projection_passages) > 20
    assert all(p.end <= req.projection_question.begin for p in req.projection_passages)
    assert EVIDENCE in out.served_text


@pytest.mark.parametrize(("projection", "message"), [(None, "none returned"), ("short", "(")])
def test_a_missing_or_short_projection_reply_fails_closed(smollm2_tokenizer, projection, message):
    cfg = build_config(
        {**CFG, "select_semantic_weight": 0.0, "select_projection_weight": 0.5}, env={}
    )
    scorer = _decoy_and_projection(_content()[:3000], projection=projection)
    with pytest.raises(CompressionFailed, match=re.escape(message)) as err:
        _compress(smollm2_tokenizer, cfg, scorer)
    assert err.value.stage == "drafter" and "projection" in err.value.message


def test_the_evidence_weights_may_not_exceed_one_together():
    from pflash.errors import ConfigError

    with pytest.raises(ConfigError, match="select_projection_weight"):
        build_config({"select_semantic_weight": 0.6, "select_projection_weight": 0.5}, env={})
    build_config({"select_semantic_weight": 0.5, "select_projection_weight": 0.5}, env={})


def _many_near_misses(decoy: str):
    """Cosine 0.9 for the evidence, 0.7 for every passage of `decoy` (more text than the
    budget), 0.1 elsewhere: many passages nearly as good as the one that answers."""

    def scorer(req, drafter):
        base = _decoy(decoy)(req, drafter)
        near = {t for t in req.semantic_texts if t.strip() and t.strip() in decoy}
        sims = [0.9 if "Sorvux" in t else 0.7 if t in near else 0.1 for t in req.semantic_texts]
        return ScoreResult(mass=base.mass, semantic=np.array([sims], dtype=np.float32))

    return scorer


@pytest.mark.parametrize("cuts", [False, True])
def test_passage_cuts_let_the_best_passage_beat_chunks_full_of_near_misses(smollm2_tokenizer, cuts):
    """Ranked by chunk, a chunk of three near misses (3 x 0.7) beats the chunk holding the
    answer (0.9 next to filler); cut at the passages, each passage is ranked by its own score."""
    decoy = _content()[:3000]
    cfg = build_config({**CFG, "select_semantic_weight": 1.0, "select_passage_cuts": cuts}, env={})
    out, req = _compress(smollm2_tokenizer, cfg, _many_near_misses(decoy))
    assert (EVIDENCE in out.served_text) is cuts
    assert out.stats["segments"] > (len(req.semantic_passages) if cuts else 0)


FIRM_FACTS = (
    "Kunlun took in revenue of 15317 thousand euros over its latest year.",
    "The staff of Kunlun numbers 7176.",
    "The Kunlun chain counts 54 shops.",
    "Kunlun was started by Sabine Nextreil.",
)
FIRM_QUESTION = "About the firm described above: How large is its staff? Who founded it?"


def _firm_document() -> str:
    body = open("/usr/share/common-licenses/GPL-3").read()[:12000]
    breaks = [i for i in range(len(body)) if body.startswith("\n\n", i)]
    picks = [breaks[len(breaks) * (k + 1) // 5] for k in range(4)]
    for at, fact in sorted(zip(picks, FIRM_FACTS, strict=True), reverse=True):
        body = body[:at] + "\n\n" + fact + body[at:]
    return body + "\n\n" + FIRM_QUESTION


def _one_fact_found(decoy: str):
    """The revenue fact matches (0.9); the firm's other facts score below the many near
    misses of `decoy` (0.45 against 0.7), 0.1 elsewhere."""

    def scorer(req, drafter):
        base = _decoy(decoy)(req, drafter)
        sims = [
            0.9
            if "revenue" in t
            else 0.45
            if "Kunlun" in t
            else 0.7
            if t.strip() and t.strip() in decoy
            else 0.1
            for t in req.semantic_texts
        ]
        rows = [sims] * len(req.semantic_questions)
        return ScoreResult(mass=base.mass, semantic=np.array(rows, dtype=np.float32))

    return scorer


@pytest.mark.parametrize("feedback", [False, True])
def test_entity_feedback_keeps_every_fact_about_the_firm_the_best_passage_names(
    smollm2_tokenizer, feedback
):
    content = _firm_document()
    cfg = build_config(
        {
            **CFG,
            "select_semantic_weight": 1.0,
            "select_passage_cuts": True,
            "select_entity_feedback": feedback,
        },
        env={},
    )
    out, _ = _compress(smollm2_tokenizer, cfg, _one_fact_found(content[:3000]), content)
    kept = [f in out.served_text for f in FIRM_FACTS]
    assert kept[0]  # the fact the embedder found is kept either way
    assert all(kept) is feedback


LEASES = tuple(
    f"The {name} lease runs for {n} months."
    for name, n in [("Zeinka", 147), ("Plolfou", 197), ("Zonquix", 324), ("Turmos", 153)]
)
MONTHLY_QUESTION = "What amount is held back each month against possible harm to the property?"


def _leases_document() -> str:
    body = _content()[: -len(QUESTION)]
    breaks = [i for i in range(len(body)) if body.startswith("\n\n", i)]
    picks = [breaks[len(breaks) * (k + 1) // 6] for k in range(len(LEASES))]
    for at, line in sorted(zip(picks, LEASES, strict=True), reverse=True):
        body = body[:at] + "\n\n" + line + body[at:]
    return body + MONTHLY_QUESTION


@pytest.mark.parametrize("semantic", [0.0, 1.0])
def test_with_passage_evidence_text_sharing_only_plain_words_is_not_kept_first(
    smollm2_tokenizer, semantic
):
    """Each lease line shares only the plain word "month" with the question: without passage
    evidence it is lexical evidence, kept first; with passage evidence it competes by its
    score, and the answer the embedder found (0.9 against 0.1) is kept."""
    content = _leases_document()
    cfg = build_config(
        {**CFG, "select_lexical": "cascade", "select_semantic_weight": semantic}, env={}
    )
    out, _ = _compress(smollm2_tokenizer, cfg, _decoy_and_semantic(content[:3000]), content)
    assert out.stats["lexical_units"] >= len(LEASES)  # found either way
    if semantic:
        assert out.stats["lexical_kept"] == 0
        assert EVIDENCE in out.served_text
    else:
        assert out.stats["lexical_kept"] > 0
        assert all(line in out.served_text for line in LEASES)


FIRM_LINES = (
    "Kunlun took in revenue of 15317 thousand euros over its latest year.",
    "The staff of Kunlun numbers 7176.",
    "The Kunlun chain counts 54 shops.",
    "Kunlun was started by Sabine Nextreil.",
)
LEASE_LINES = (
    "Every month the Doultheix tenant pays 1598 credits.",
    "The Doultheix tenancy lasts 103 months from signing.",
    "Doultheix holders lodge 9168 credits up front.",
    "Ending the Doultheix lease early costs 700 credits.",
)


def _entity_signals(tokenizer, semantic_weight: float):
    """passage_signals over firm facts, lease lines and licence filler: the embedder ranks
    the firm's revenue first and the firm's other facts above the leases; the projection's
    raw cosines put the leases first (0.80) and the firm (0.70) just above the filler."""
    filler = [s.strip() + "." for s in _content(4000).split(". ")[:24] if len(s) > 20]
    lines = [*FIRM_LINES, *LEASE_LINES, *filler]
    drafter = encode_as_written_with_offsets(tokenizer, "\n".join(lines) + "\n")
    passages = evidence_passages(drafter, len(drafter), [], max_tokens=24)
    texts = [drafter.text[slice(*drafter.char_span(p))] for p in passages]

    def cosine(text, firm, lease, other):
        return firm if "Kunlun" in text else lease if "Doultheix" in text else other

    semantic = [cosine(t, 0.9 if "revenue" in t else 0.6, 0.5, 0.1) for t in texts]
    projection = [cosine(t, 0.70, 0.80, 0.65) for t in texts]
    cfg = build_config(
        {
            **CFG,
            "select_semantic_weight": semantic_weight,
            "select_projection_weight": 1.0 - semantic_weight,
            "select_entity_feedback": True,
        },
        env={},
    )
    req = SimpleNamespace(
        semantic_passages=passages if semantic_weight else (),
        semantic_texts=tuple(texts) if semantic_weight else (),
        semantic_questions=("About the firm: how large is its staff?",),
        projection_passages=passages,
        evidence_blocks=(),
    )
    scores = SimpleNamespace(
        semantic=np.array([semantic], dtype=np.float32), projection=np.array(projection)
    )
    out = passage_signals(req, scores, cfg, drafter)
    firm = [i for i, t in enumerate(texts) if "Kunlun" in t]
    return out[-1].scores, firm, projection  # the projection's signal comes last


def test_the_projection_follows_the_entity_the_embedder_picks(smollm2_tokenizer):
    alone, firm, raw = _entity_signals(smollm2_tokenizer, semantic_weight=0.0)
    assert alone.max() == 1.0 and alone[np.asarray(raw) <= np.median(raw)].max() == 0.0
    assert alone[firm].max() < 0.9  # alone it follows its own best name, the leases
    mixed, firm, _ = _entity_signals(smollm2_tokenizer, semantic_weight=0.5)
    assert mixed[firm].min() >= 0.9  # with the embedder it lifts the embedder's firm
