"""Baselines: tail truncation and random chunks keep the budget, deterministically."""

from __future__ import annotations

from pflash_lab.bench.baselines import budget_tokens, random_chunks, tail_truncate

TEXT = " ".join(f"word{i}" for i in range(600))


def _n(tok, text):
    return len(tok(text, add_special_tokens=False)["input_ids"])


def test_budget_is_the_floor_of_ratio_times_tokens_and_at_least_one():
    assert budget_tokens(1000, 0.1) == 100
    assert budget_tokens(999, 0.1) == 99
    assert budget_tokens(5, 0.01) == 1


def test_tail_truncation_keeps_exactly_the_last_budget_tokens(smollm2_tokenizer):
    out = tail_truncate(TEXT, 0.1, smollm2_tokenizer)
    total = _n(smollm2_tokenizer, TEXT)
    assert out.kept_tokens == total // 10
    assert TEXT.endswith(out.document)
    assert "word599" in out.document and "word0 " not in out.document


def test_random_chunks_are_seeded_in_order_and_within_budget(smollm2_tokenizer):
    a = random_chunks(TEXT, 0.2, smollm2_tokenizer, seed=3)
    b = random_chunks(TEXT, 0.2, smollm2_tokenizer, seed=3)
    c = random_chunks(TEXT, 0.2, smollm2_tokenizer, seed=4)
    assert a.document == b.document and a.document != c.document
    assert a.kept_tokens <= budget_tokens(_n(smollm2_tokenizer, TEXT), 0.2)
    assert a.kept_tokens >= budget_tokens(_n(smollm2_tokenizer, TEXT), 0.2) - 64
    positions = [TEXT.index(piece) for piece in a.document.split("\n\n")]
    assert positions == sorted(positions)  # chunks are pieces of the text, in source order
