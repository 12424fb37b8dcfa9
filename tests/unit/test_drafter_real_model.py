"""The embedded SmolLM2 drafter on real prose: the needle's chunk ranks near the top.

~2K-token ChatML prompts built from license texts and Python stdlib docstrings with one
needle sentence; the scorer queries with the generation prompt's last token and the
question's last 8 tokens (the chat-first default). The generic profile's default head
layer (17 of 30) was chosen from the per-layer table of `pflash_lab.bench.drafter_speed`.
"""

from __future__ import annotations

import pytest
import torch
from conftest import UNTUNED

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
