"""A sentence that refers back (pflash/compress/evidence/antecedents.py, and its use in passage
evidence and lexical evidence): which sentences refer back, what they refer to, how the
embedder reads them, and that they are scored and anchored with their antecedent.

The pure steps on plain text and word-token drafter text; the lexical rule on a prompt
rendered and planned with the real SmolLM2 tokenizer, as the other lexical tests are.
"""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

from pflash.compress.evidence.antecedents import (
    ANTECEDENT_MAX_CHARS,
    lift_antecedents,
    passage_antecedents,
    refers_back,
)
from pflash.compress.evidence.lexical import LexicalParams, find_lexical_evidence
from pflash.compress.evidence.passage_evidence import passage_texts
from pflash.compress.evidence.words import split_units
from pflash.compress.pipeline import CompressionRequest, prepare
from pflash.compress.render.chat import render_chat
from pflash.compress.render.rendered import RenderedPrompt
from pflash.config import build_config
from pflash.spans import Span, TokenizedText

HOMER = (
    'Homer Jay Simpson is a fictional character of the series "The Simpsons". '
    "He is voiced by Dan Castellaneta and first appeared on television in 1987."
)
DAN = (
    "Daniel Louis Castellaneta (born October 29, 1957) is an American actor. "
    "Noted for his long-running role as Homer Simpson, he also voices many other characters."
)


def _sentences(text: str) -> list[tuple[int, int]]:
    """One span per sentence or line (the way passages are cut at sentence starts)."""
    return [(m.start(), m.end()) for m in re.finditer(r"[^\s.][^.\n]*\.?", text)]


def _word_tokens(text: str) -> TokenizedText:
    offsets = tuple(m.span() for m in re.finditer(r"\S+", text))
    return TokenizedText(text, tuple(range(len(offsets))), offsets)


@pytest.mark.parametrize(
    "head, expected",
    [
        ("He is voiced by Dan Castellaneta", True),
        ("Noted for his long-running role as Homer Simpson", True),
        ("It originally aired on the Fox network", True),
        ("In 1990, they moved to Paris", True),
        ("Voiced by Dan Castellaneta, he is the father of Homer", False),  # a name first
        ("Homer Jay Simpson is a fictional character", False),
        ("The committee met on a Tuesday and after long debate it agreed", False),  # too late
        ("These results hold for every case", False),
    ],
)
def test_a_sentence_refers_back_when_a_pronoun_comes_early_and_before_any_name(head, expected):
    assert refers_back(head) is expected


def test_a_referring_sentence_points_at_the_sentence_before_it_in_its_line():
    text = "Document 8:\nHomer Simpson\n" + HOMER
    spans = _sentences(text)
    found = passage_antecedents(text, spans)
    pieces = [text[b:e] for b, e in spans]
    he = pieces.index("He is voiced by Dan Castellaneta and first appeared on television in 1987.")
    a, end = found[he]
    assert text[a:end] == 'Homer Jay Simpson is a fictional character of the series "The Simpsons".'
    # the lead opens its line: it refers to nothing, nor do the title lines
    assert all(found[i] == (-1, -1) for i in range(len(spans)) if i != he)


def test_the_antecedent_is_the_sentence_naming_the_subject_over_those_that_refer_back():
    text = (
        "The Morpeth Arms is a public house at 58 Millbank. It was built in 1845. "
        "It now contains a Spying Room."
    )
    spans = _sentences(text)
    found = passage_antecedents(text, spans)
    assert [text[a:e] if a >= 0 else None for a, e in found] == [
        None,
        "The Morpeth Arms is a public house at 58 Millbank.",
        "The Morpeth Arms is a public house at 58 Millbank.",
    ]


def test_a_mark_before_a_lower_case_word_ends_no_antecedent():
    text = 'Nedward "Ned" Flanders, Jr. is a recurring character. He is voiced by Harry Shearer.'
    spans = [(0, 53), (54, len(text))]
    (_, (a, end)) = passage_antecedents(text, spans)
    assert text[a:end].startswith('Nedward "Ned" Flanders, Jr. is')


def test_a_sentence_after_a_line_break_refers_to_nothing():
    text = "Homer Jay Simpson is a character.\nHe is voiced by Dan Castellaneta."
    spans = _sentences(text)
    assert passage_antecedents(text, spans)[1] == (-1, -1)


def test_the_embedder_reads_a_referring_passage_after_its_antecedent():
    drafter = _word_tokens(HOMER)
    he = HOMER.index("He is")
    first = next(i for i, (b, _) in enumerate(drafter.offsets) if b == he)
    passages = (Span(0, first), Span(first, len(drafter.ids)))
    read = passage_texts(drafter, passages)
    plain = [HOMER[slice(*drafter.char_span(p))] for p in passages]
    assert read[0] == plain[0]  # the lead is read as it is
    assert read[1].startswith("Homer Jay Simpson is a fictional character")
    assert read[1].endswith(plain[1]) and "He is voiced by Dan Castellaneta" in read[1]


def test_the_embedder_reads_at_most_the_antecedents_first_characters():
    lead = "Ada Quell wrote " + "many long and winding " * 30 + "novels."
    text = lead + " She lives in Tavisham."
    drafter = _word_tokens(text)
    first = next(i for i, (b, _) in enumerate(drafter.offsets) if text[b:].startswith("She"))
    passages = (Span(0, first), Span(first, len(drafter.ids)))
    read = passage_texts(drafter, passages)[1]
    assert read.startswith(lead[:ANTECEDENT_MAX_CHARS].strip())
    assert len(read) <= ANTECEDENT_MAX_CHARS + 1 + len(" She lives in Tavisham.")


def test_a_scored_referring_passage_lifts_the_sentence_naming_its_subject():
    text = (
        "Abraham Simpson is a character of the show. He made his first appearance in 1987. "
        "He is the father of Homer. The show ran for years."
    )
    spans = _sentences(text)
    values = np.array([0.1, 0.2, 0.9, 0.3])
    out = lift_antecedents(spans, values, passage_antecedents(text, spans))
    assert out.tolist() == [0.9, 0.2, 0.9, 0.3]  # the sentence naming him; the rest stays
    assert values.tolist() == [0.1, 0.2, 0.9, 0.3]  # the input is not changed


def test_scores_only_rise_and_text_without_references_is_unchanged():
    text = "The grass is green. The sky is blue. The sun is yellow."
    spans = _sentences(text)
    values = np.array([0.5, 0.0, 1.0])
    assert (
        lift_antecedents(spans, values, passage_antecedents(text, spans)).tolist()
        == values.tolist()
    )


def _read_back_seconds(n: int) -> float:
    """The best of two timings of both steps over `n` referring sentences after a long gap."""
    text = "Ada Quell is here. " + "He is. " * n + "\n" + " " * (10 * n) + "It is."
    spans = _sentences(text)
    units = split_units(text)
    best = float("inf")
    for _ in range(2):
        start = time.perf_counter()
        lift_antecedents(spans, np.ones(len(spans)), passage_antecedents(text, spans))
        passage_antecedents(text, units)
        best = min(best, time.perf_counter() - start)
    return best


def test_referring_sentences_are_read_in_linear_time():
    """Four times the text takes about four times as long (quadratic would be sixteen); a
    ratio, so a loaded machine does not fail it."""
    small, large = _read_back_seconds(20_000), _read_back_seconds(80_000)
    assert large < 8 * small


# ----------------------------------------------------------------------------- lexical rule


def _prepared(tokenizer, content: str, **cfg):
    config = build_config(
        {"mode": "always", "keep_ratio": 0.1, "select_chunk_size": 64, **cfg}, env={}
    )
    messages = [{"role": "user", "content": content}]
    ids = tuple(tokenizer(render_chat(tokenizer, messages), add_special_tokens=False)["input_ids"])
    inp = CompressionRequest(
        RenderedPrompt("chat", tuple(ids), tokenizer, messages=messages),
        max_output=64,
        max_context=16384,
    )
    return prepare(inp, config=config, target_tokenizer=tokenizer, drafter_tokenizer=tokenizer)


def _filler() -> str:
    return open("/usr/share/common-licenses/GPL-3").read()[:6000]


def test_a_hit_opening_with_a_pronoun_anchors_the_sentence_it_stands_for(smollm2_tokenizer):
    content = (
        "Document 1:\nHomer Simpson\n"
        + HOMER
        + "\n\n"
        + _filler()
        + "\n\nDocument 2:\nDan Castellaneta\n"
        + DAN
        + "\n\nWho voices many other characters besides Homer Simpson?"
    )
    prepared = _prepared(smollm2_tokenizer, content)
    plan = prepared.plan
    ev = find_lexical_evidence(plan, pinned=(), params=LexicalParams(mode="anchors"))
    text = plan.drafter.text
    got = {text[slice(*plan.drafter.char_span(u.span))].strip(): u for u in ev.units}
    voiced = "He is voiced by Dan Castellaneta and first appeared on television in 1987."
    actor = "Daniel Louis Castellaneta (born October 29, 1957) is an American actor."
    assert voiced not in got or got[voiced].reason != "referent"  # only back, never ahead
    noted = next(u for t, u in got.items() if t.startswith("Noted for his"))
    assert got[actor].reason == "referent" and got[actor].named == noted.named
    assert got[actor].score < noted.score
