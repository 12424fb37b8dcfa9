"""The embedded SmolLM2 drafter on real prose: the needle's chunk ranks near the top.

~2K-token ChatML prompts built from license texts and Python stdlib docstrings with one
needle sentence; the scorer queries with the generation prompt's last token and the
question's last 8 tokens (the chat-first default). The generic profile's default head
layer (17 of 30) was chosen from the per-layer table of `pflash_lab.bench.drafter_speed`.
"""

from __future__ import annotations

import pytest
import torch
from conftest import PARAPHRASED, UNTUNED

from pflash.compress.scoring import ScoreRequest
from pflash.config import build_config
from pflash_lab.corpus.needles import needle_prompt, needle_rank

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def scorer():
    torch.set_num_threads(1)
    from pflash.models.drafter.scorer import DrafterScorer

    return DrafterScorer(build_config(UNTUNED, env={}))  # the generic profile's own layer


def test_embedded_drafter_loads_with_facts_from_its_gguf(scorer):
    facts = scorer.loaded.gguf
    assert (scorer.loaded.architecture, facts.n_layer, facts.tied_output) == ("llama", 30, True)
    assert (scorer.profile.name, scorer.profile.head_layer) == ("generic", 17)
    assert scorer.profile.tap == "post_block16_residual_before_block17"


@pytest.mark.parametrize("depth, needle, offset", [(0.15, 0, 500), (0.5, 1, 900), (0.85, 2, 1300)])
def test_needle_chunk_ranks_in_the_top_tenth_of_context_chunks(
    scorer, smollm2_tokenizer, depth, needle, offset
):
    prompt = needle_prompt(smollm2_tokenizer, 2048, depth, needle=needle, offset=offset)
    result = scorer(ScoreRequest(ids=prompt.ids, windows=prompt.windows, query=prompt.query))
    rank, chunks = needle_rank(result.mass, prompt, chunk=64)
    assert chunks >= 28
    assert rank <= chunks // 10, f"needle chunk ranked {rank} of {chunks}"
    assert result.scorer_new_tokens == len(prompt.ids)


@pytest.mark.parametrize("fact, question", PARAPHRASED)
def test_likelihood_ranks_the_passage_answering_a_paraphrased_question_near_the_top(
    scorer, smollm2_tokenizer, fact, question
):
    from pflash.compress.chat import render_chat
    from pflash.compress.pipeline import PromptInput, prepare

    body = open("/usr/share/common-licenses/GPL-3").read()[:9000]
    mid = body.index("\n\n", len(body) // 2)
    content = body[:mid] + "\n\n" + fact + body[mid:] + "\n\n" + question
    messages = [{"role": "user", "content": content}]
    text = render_chat(smollm2_tokenizer, messages)
    ids = tuple(smollm2_tokenizer(text, add_special_tokens=False)["input_ids"])
    cfg = build_config(
        {"mode": "always", "select_likelihood_weight": 1.0, "select_semantic_weight": 0.0}, env={}
    )
    prepared = prepare(
        PromptInput(prompt_ids=ids, messages=messages),
        config=cfg,
        target_tokenizer=smollm2_tokenizer,
        drafter_tokenizer=smollm2_tokenizer,
    )
    req = prepared.score_request
    gains = scorer(req).likelihood
    drafter = prepared.plan.drafter
    at = drafter.text.index(fact)
    (holding,) = [
        i
        for i, p in enumerate(req.likelihood_passages)
        if drafter.char_span(p)[0] <= at < drafter.char_span(p)[1]
    ]
    rank = int((gains > gains[holding]).sum())
    assert len(gains) >= 20
    assert rank <= 2, f"the fact's passage ranked {rank} of {len(gains)}: {sorted(gains)[-4:]}"
