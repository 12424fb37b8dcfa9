"""Block-sparse drafter attention: sink + window + the best-matching earlier
blocks below the scoring layer.

The attention alone on random tensors (reading every block is dense causal attention; the
selection keeps sinks, the window and the block the query matches), then through the real
scorer on tiny random-weight llama, qwen3 and qwen3_5 models: `top` covering the prompt
gives the dense scores, a small `top` really prunes, a 16K prompt reads at most a fixed
number of keys per query block, and a resumed session scores as a fresh pass.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_drafter_window import HEAD_LAYER, make_scorer, random_ids, request

from pflash.compress.plan.query import QueryWindow
from pflash.compress.scoring import ScoreRequest
from pflash.models.drafter import block_sparse
from pflash.models.drafter.block_sparse import (
    BlockSparseSpec,
    block_means,
    block_sparse_attention,
    selected_blocks,
)
from pflash.spans import Span


def sparse(kind: str, *, block=16, sink=4, window=32, top=2, **config):
    return make_scorer(
        kind,
        drafter_attention="block_sparse",
        drafter_block_tokens=block,
        drafter_sink_tokens=sink,
        drafter_window_tokens=window,
        drafter_top_blocks=top,
        **config,
    )


def dense_causal(q, k, v):
    group = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    start = k.shape[2] - q.shape[2]
    mask = torch.arange(k.shape[2])[None, :] <= torch.arange(start, k.shape[2])[:, None]
    return F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask).transpose(1, 2)


# --------------------------------------------------------------------------- the attention


@pytest.mark.parametrize(("keys", "chunk"), [(640, 640), (640, 100), (777, 77), (50, 50)])
def test_reading_every_block_is_dense_causal_attention(keys, chunk):
    g = torch.Generator().manual_seed(keys + chunk)
    q = torch.randn(1, 6, chunk, 32, generator=g)
    k, v = torch.randn(2, 1, 2, keys, 32, generator=g)
    spec = BlockSparseSpec(block=64, sink=16, window=64, top=keys)
    got = block_sparse_attention(q, k, v, spec)
    assert got.shape == (1, chunk, 6, 32)
    torch.testing.assert_close(got, dense_causal(q, k, v), atol=1e-6, rtol=0)


def test_a_small_top_prunes_and_stays_a_distribution_over_what_it_reads():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 64, 16, generator=g)
    k, _ = torch.randn(2, 1, 2, 2048, 16, generator=g)
    ones = torch.ones(1, 2, 2048, 16)  # attention of ones is 1 whatever is read
    spec = BlockSparseSpec(block=64, sink=16, window=128, top=1)
    torch.testing.assert_close(block_sparse_attention(q, k, ones, spec), torch.ones(1, 64, 4, 16))
    v = torch.randn(1, 2, 2048, 16, generator=g)
    assert (block_sparse_attention(q, k, v, spec) - dense_causal(q, k, v)).abs().max() > 1e-2


def test_the_selection_keeps_sinks_the_window_and_the_block_the_query_matches():
    spec = BlockSparseSpec(block=10, sink=15, window=20, top=1)
    means = torch.zeros(1, 12, 4)
    means[0, 5] = torch.tensor([1.0, 0, 0, 0])  # the one block the query points at
    q_mean = torch.tensor([[3.0, 0, 0, 0]])
    got = selected_blocks(q_mean, means, 11, spec)[0].tolist()
    assert got == [0, 1, 5, 9, 10, 11]  # sinks 0-1, block 5, window 9-10, itself 11
    assert len(got) * spec.block <= spec.keys_per_query_block()
    assert selected_blocks(q_mean, means, 1, spec)[0].tolist() == [0, 1]  # all of it, causally


def test_block_means_average_a_partial_last_block_over_its_tokens():
    keys = torch.arange(10, dtype=torch.float32).reshape(1, 10, 1)
    assert block_means(keys, 4)[0, :, 0].tolist() == [1.5, 5.5, 8.5]


def test_outside_the_trunk_context_the_attention_refuses_to_run():
    with pytest.raises(RuntimeError):
        block_sparse._attention(None, *torch.zeros(3, 1, 1, 2, 4), None)


# --------------------------------------------------------------------------- the real scorer


@pytest.mark.parametrize("kind", ["llama", "qwen3", "qwen3_5"])
def test_top_blocks_covering_the_prompt_give_the_dense_scores(kind):
    req = request(150)
    dense = make_scorer(kind)(req)
    got = sparse(kind, top=100)(req)
    assert got.extras["drafter_attention"] == "block_sparse"
    np.testing.assert_allclose(got.mass, dense.mass, atol=1e-6, rtol=0)
    np.testing.assert_allclose(got.tap, dense.tap, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["llama", "qwen3_5"])
def test_a_small_top_changes_the_trunk_and_restores_the_models_attention(kind):
    req = request(300, seed=3)
    scorer = sparse(kind, top=1)
    impl = scorer.model.config._attn_implementation
    got = scorer(req)
    assert scorer.model.config._attn_implementation == impl
    assert np.isfinite(got.mass).all() and abs(float(got.mass.sum()) - 1.0) < 1e-4
    dense = make_scorer(kind)(req)
    assert np.abs(got.tap - dense.tap).max() > 1e-3  # the selection really pruned


def test_a_16k_prompt_reads_a_fixed_number_of_keys_per_query_block(monkeypatch):
    reads = []
    original = block_sparse.attend

    def counting(q, k, v, allowed, scale):
        reads.append(k.shape[-2])
        return original(q, k, v, allowed, scale)

    monkeypatch.setattr(block_sparse, "attend", counting)
    scorer = sparse("llama", block=64, sink=16, window=256, top=2, drafter_chunk_tokens=512)
    result = scorer(request(16384, tap=False))
    assert result.mass.shape == (16384,) and np.isfinite(result.mass).all()
    assert len(reads) == HEAD_LAYER["llama"] * 16384 // 64  # one call per layer and block
    assert max(reads) == scorer.block_sparse.keys_per_query_block() == (1 + 5 + 2) * 64


def test_a_resumed_session_scores_like_a_fresh_pass_at_block_boundaries():
    main = QueryWindow(Span(199, 200), 1.0, "main")
    one = ScoreRequest(ids=random_ids(200, 1), windows=(main,), query=main.span, session_key="c")
    ids = one.ids[:192] + random_ids(70, 2)  # shares 192 tokens = 12 blocks of 16
    windows = (QueryWindow(Span(261, 262), 1.0, "main"),)
    two = ScoreRequest(ids=ids, windows=windows, query=windows[0].span, session_key="c")
    scorer = sparse("llama", drafter_chunk_tokens=32)
    scorer(one)
    resumed = scorer(two)
    assert resumed.scorer_resume == 192
    fresh = sparse("llama", drafter_chunk_tokens=32)(
        ScoreRequest(**{**two.__dict__, "session_key": None})
    )
    np.testing.assert_allclose(resumed.mass, fresh.mass, atol=1e-6, rtol=0)
