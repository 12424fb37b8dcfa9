"""The second hop: a question's own passage names a bridge entity, and the passages about
that entity are lifted (pure functions, no model)."""

from __future__ import annotations

import numpy as np
import pytest

from pflash.compress.evidence.bridge import (
    BRIDGE_LIFT,
    MAX_LIFTED,
    adds_fact,
    bridge_names,
    lift_second_hop,
    question_names,
    same_entity,
    second_hop,
)
from pflash.compress.evidence.entity_feedback import LIFT, followed_passages, lift_passages
from pflash.compress.evidence.passage_evidence import part_shares
from pflash.compress.render.chat import render_chat
from pflash.compress.render.rendered import RenderedPrompt
from pflash.compress.scoring import ScoreResult
from pflash.compress.text.sentences import split_sentences
from pflash.config import build_config
from pflash.flow.in_process import compress_in_process
from pflash_lab.corpus.cases import CaseSpec, token_counter
from pflash_lab.corpus.families import generate

QUESTION = "Which school did the person who directed The Tallow Moon attend?"
TEXTS = [
    "The Tallow Moon is a feature film first presented to the public in 1931.",  # 0
    "The Tallow Moon was directed by Mara Quell.",  # 1: hop 1
    "Reviews of The Tallow Moon were mixed at the time.",  # 2
    "Mara Quell worked with a small circle of collaborators.",  # 3
    "Quell studied at Velloran College.",  # 4: hop 2, no word of the question
    "Letters written by Quell were published in 1970.",  # 5
    "The person who directed The Amber Gate, Olin Varre, attended school at Brisk.",  # 6
    "Olin Varre trained for four years at the Morrow Polytechnic.",  # 7
    "Varre declined most interviews.",  # 8
    "Ivo Whitlock studied at Glennard College.",  # 9
    "Whitlock rarely travelled abroad.",  # 10
    "The license grants permission to copy and distribute the work.",  # 11
]
# a text of 40 passages: a bridge name may be in up to 4 of them (`MAX_SHARE`)
FILLER = [f"the licence clause {k} applies to every copy of the work." for k in range(28)]
TEXTS += FILLER
# the embedder's picture: near misses about other people's schooling outrank the hop 2
VALUES = np.array([0.5, 0.8, 0.45, 0.2, 0.3, 0.1, 1.0, 0.6, 0.05, 0.55, 0.0, 0.0] + [0.0] * 28)
N = len(TEXTS)


def test_question_names_are_its_capitalised_words_but_stop_words_and_the_opening_one():
    assert question_names(QUESTION) == {"Tallow", "Moon"}
    assert question_names("In which year was the firm described above founded?") == set()


def test_the_bridge_is_the_last_new_name_of_each_run_of_names_in_the_hop_one_passage():
    found = {"Tallow": [0, 1, 2], "Moon": [0, 1, 2], "Mara": [1, 3], "Quell": [1, 3, 4, 5]}
    assert bridge_names(TEXTS[1], {"Tallow", "Moon"}, found) == ["Quell"]
    assert bridge_names(TEXTS[0], {"Tallow", "Moon"}, found) == []


def test_the_passages_about_the_bridge_entity_are_lifted_above_the_near_misses():
    out = lift_second_hop(TEXTS, VALUES, QUESTION)
    # the hop-2 passage, 7th of 40 before: above what entity feedback lifts passages to
    assert out[4] == pytest.approx(BRIDGE_LIFT + (1 - BRIDGE_LIFT) * 0.3)
    assert BRIDGE_LIFT > LIFT
    assert out[4] > out[7] and out[4] > out[9]  # above the other people's schooling
    assert out[1] >= BRIDGE_LIFT  # and the hop-1 passage with it
    assert out[4] > out[5]  # among themselves in the order of their own scores
    assert out[3] == VALUES[3]  # names Quell, states nothing more: not lifted


def test_the_lift_only_raises_and_at_most_the_bounded_number_of_passages():
    out = lift_second_hop(TEXTS, VALUES, QUESTION)
    assert np.all(out >= VALUES)
    raised = np.flatnonzero(out > VALUES).tolist()
    assert raised == [1, 4, 5]  # hop 1 and the passages naming Quell that state a fact
    rest = [i for i in range(N) if i not in raised]
    assert np.array_equal(out[rest], VALUES[rest])


def test_the_hop_one_passage_names_most_of_the_questions_names():
    # another work sharing one word of the title scores best; the title's own passage is read
    texts = ["The Winter Moon was directed by Olin Varre.", *TEXTS[1:]]
    values = VALUES.copy()
    values[0] = 1.0
    (group,) = second_hop(texts, values, QUESTION, hop1_passages=1)
    assert group == [1, 4, 5]


def test_of_the_bridge_passages_those_naming_its_whole_run_are_lifted_first():
    """A long text holds other Quells and other Maras (in a 32K two_hop case of the bench,
    35 passages named the bridge's first name, and the answer came ninth by score of those
    naming its surname): the passage naming the whole "Mara Quell" is lifted though three
    passages about other Quells score better."""
    texts = [
        *TEXTS[:4],
        "The grave of Mara Quell lies in Quarnby.",  # 4: hop 2, the whole name, scored low
        "Idris Quell designed a viaduct in 1920.",  # 5-7: other Quells, scored higher
        "Sabel Quell was laid to rest in Kestow.",
        "Tomas Quell studied at Brennick.",
        *TEXTS[8:],
    ]
    values = VALUES.copy()
    values[4:8] = [0.1, 0.5, 0.45, 0.4]
    # six of 40 passages name Quell: a share the default (10%) would count as everywhere
    (group,) = second_hop(texts, values, QUESTION, hop1_passages=1, max_share=0.2)
    assert group[:2] == [1, 4]  # hop 1, then the whole name though it scores lowest
    assert group[2:] == [5, 6]  # then the other Quells by score, up to MAX_LIFTED in all
    assert len(group) == 1 + MAX_LIFTED


def test_a_passage_naming_the_bridge_by_surname_alone_goes_before_other_people_of_that_name():
    """Seed 10302's 32K case: "Quell passed the early years of life in Istrabel." (about
    Mara Quell, named by surname as later sentences do) scored below facts about three other
    Quells, and only three passages are lifted."""
    texts = [
        *TEXTS[:4],
        "Quell passed the early years of life in Istrabel.",  # 4: hop 2, surname alone
        "Dorian Quell grew up in the town of Carrowmere.",  # 5-7: other Quells, higher
        "The Amber Kingdom was written by Sabel Quell.",
        "Tomas Quell studied at Pyrford Lyceum.",
        *TEXTS[8:],
    ]
    values = VALUES.copy()
    values[4:8] = [0.2, 0.68, 0.46, 0.34]
    (group,) = second_hop(texts, values, QUESTION, hop1_passages=1, max_share=0.2)
    assert group[:2] == [1, 4]
    assert same_entity(texts[4], "Quell", {"Mara", "Quell"})
    assert not same_entity(texts[5], "Quell", {"Mara", "Quell"})
    assert same_entity("The grave of Mara Quell lies in Quarnby.", "Quell", {"Mara", "Quell"})


def test_a_passage_adds_a_fact_with_a_number_or_a_name_of_its_own():
    known = {"Mara", "Quell", "Tallow", "Moon"}
    assert adds_fact("Quell studied at Velloran College.", known)
    assert adds_fact("Letters written by Quell were published in 1970.", known)
    assert not adds_fact("Mara Quell worked with a small circle of collaborators.", known)
    assert not adds_fact("In later life Quell gave lectures.", known)  # "In" opens it


def test_a_question_naming_nothing_changes_nothing():
    question = "Where did the author of the novel described above study?"
    assert second_hop(TEXTS, VALUES, question) == []
    assert np.array_equal(lift_second_hop(TEXTS, VALUES, question), VALUES)


def test_a_single_hop_question_whose_passage_names_nothing_new_changes_nothing():
    texts = ["The Kunlun code is 4471.", "Kunlun is based in Ortmund.", *TEXTS[6:]]
    values = np.concatenate([[1.0, 0.5], VALUES[6:]])
    # the answer passage names no one else; Ortmund is in one passage only
    assert second_hop(texts, values, "What is the access code for Kunlun?") == []


@pytest.mark.parametrize("values", [np.zeros(N), np.full(N, -0.5)])
def test_nothing_above_zero_changes_nothing(values):
    assert np.array_equal(lift_second_hop(TEXTS, values, QUESTION), values)


def test_scores_and_passages_must_match():
    with pytest.raises(ValueError, match="3 scores for 40 passages"):
        second_hop(TEXTS, np.zeros(3), QUESTION)


@pytest.fixture(scope="module")
def embedder():
    import torch

    from pflash.models.embedder import SentenceEmbedder

    torch.set_num_threads(1)
    return SentenceEmbedder("embedded:all-minilm-l6-v2")


def test_with_the_real_embedder_the_second_hop_moves_into_the_first_few_passages(
    embedder, smollm2_tokenizer
):
    # the bench's two_hop cases, one sentence a passage, scored as passage evidence scores
    # them (share of the best over the median, entity feedback first)
    count = token_counter(smollm2_tokenizer)
    before, after = [], []
    for seed in range(4):
        case = generate(CaseSpec("two_hop", seed, 2048), count)
        (turn,) = case.turns
        texts = [s.strip() for p in case.document.split("\n\n") for s in split_sentences(p)]
        (sims,) = embedder.similarity([turn.question], texts)
        values = part_shares(np.asarray(sims)[None, :])[0]
        values = lift_passages(values, followed_passages(texts, values))
        lifted = lift_second_hop(texts, values, turn.question)
        hop2 = texts.index(turn.evidence[1])
        before.append(int((values > values[hop2]).sum()))
        after.append(int((lifted > lifted[hop2]).sum()))
        assert int((lifted > values).sum()) <= 2 * (MAX_LIFTED + 1), case.case_id
    assert min(before) > 5, before  # the embedder alone ranks it among the near misses
    assert max(after) <= 3, after  # the bridge lifts it to the first few


# ------------------------------------------------------------------------- the product flow

HOP1 = "The Tallow Moon was directed by Mara Quell."
HOP2 = "Quell studied at Velloran College."
NEAR_MISSES = tuple(
    f"The person who directed The {work} Gate, {first} {last}, attended school at {school}."
    for work, first, last, school in [
        (w, f, lname, s)
        for w, f, lname, s in zip(
            ["Amber", "Glass", "Iron", "Paper", "Velvet", "Winter", "Copper", "Pale"] * 3,
            ["Olin", "Ivo", "Renata", "Casimir", "Liesl", "Aurel"] * 4,
            [f"Varre{k}" for k in range(24)],
            ["Brisk", "Morrow", "Glennard", "Hadley"] * 6,
            strict=False,
        )
    ]
)


def _two_hop_document() -> str:
    body = open("/usr/share/common-licenses/GPL-3").read()[:12000]
    breaks = [i for i in range(len(body)) if body.startswith("\n\n", i)]
    facts = [HOP1, "Mara Quell worked with a small circle of collaborators. " + HOP2]
    facts += [" ".join(NEAR_MISSES[k : k + 3]) for k in range(0, len(NEAR_MISSES), 3)]
    picks = [breaks[len(breaks) * (k + 1) // (len(facts) + 1)] for k in range(len(facts))]
    for at, fact in sorted(zip(picks, facts, strict=True), reverse=True):
        body = body[:at] + "\n\n" + fact + body[at:]
    return body + "\n\n" + QUESTION


def _hop1_found(req):
    """The embedder's picture: hop 1 matches best (0.9), the near misses next (0.7), the
    second hop below them (0.45), 0.1 elsewhere; attention on nothing in particular."""
    mass = np.full(len(req.ids), 1.0, dtype=np.float32)
    mass[req.query.begin :] = 0.0
    sims = [
        0.9
        if "directed by Mara" in t
        else 0.45
        if "Velloran" in t
        else 0.7
        if "attended school" in t
        else 0.1
        for t in req.semantic_texts
    ]
    rows = [sims] * len(req.semantic_questions)
    return ScoreResult(mass=mass / mass.sum(), semantic=np.array(rows, dtype=np.float32))


@pytest.mark.parametrize("feedback", [False, True])
def test_compression_keeps_the_second_hop_the_questions_passage_names(smollm2_tokenizer, feedback):
    content = _two_hop_document()
    cfg = build_config(
        {
            "mode": "always",
            "keep_ratio": 0.1,
            "select_lexical": "off",  # hop 1 is kept by its semantic score alone
            "select_semantic_weight": 1.0,
            "select_passage_cuts": True,
            "select_entity_feedback": feedback,
        },
        env={},
    )
    messages = [{"role": "user", "content": content}]
    ids = smollm2_tokenizer(render_chat(smollm2_tokenizer, messages), add_special_tokens=False)
    prompt = RenderedPrompt("chat", tuple(ids["input_ids"]), smollm2_tokenizer, messages=messages)
    out = compress_in_process(
        prompt,
        cfg,
        target_tokenizer=smollm2_tokenizer,
        drafter_tokenizer=smollm2_tokenizer,
        scorer=_hop1_found,
        max_context=8192,
        max_output=64,
    )
    assert HOP1 in out.served_text  # the passage the question names is kept either way
    assert (HOP2 in out.served_text) is feedback
    kept_near = sum(n in out.served_text for n in NEAR_MISSES)
    assert kept_near < len(NEAR_MISSES)  # the budget holds fewer than all near misses
