"""Sink keys re-indexed next to the window (`drafter_sink_positions: adjacent`).

With the window moved on, the sink keys are read from ever farther away; `adjacent` reads
them re-rotated to sit just before the oldest window key. Held to: the shift is exactly the
model's own rotary at the later position (llama, qwen3 and qwen3_5's partial rotary); the
cache keeps the keys as rotated at first (no drift from chunk to chunk) and moves only the
sinks a chunk reads; nothing changes until something is evicted; with evictions the scores
differ from `absolute` and a resumed session still scores like a fresh pass.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_drafter_window import loaded_tiny, request, turns, windowed

from pflash.compress.scoring import ScoreRequest
from pflash.models.drafter.window import (
    RopeShift,
    SinkWindowLayer,
    WindowSpec,
    rope_shift,
    rotate_half,
    sink_delta,
    stride_cuts,
)

torch.set_num_threads(1)


def rotated_at(model, keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """`keys` [1, H, n, D] rotated by the model's own rotary module at `positions` [n]."""
    rotary = model.model.rotary_emb
    cos, sin = rotary(torch.zeros(1, positions.numel(), 1), positions[None])
    cos, sin = cos[:, None], sin[:, None]  # [1, 1, n, rd]
    rd = cos.shape[-1]
    rot, rest = keys[..., :rd], keys[..., rd:]
    return torch.cat((rot * cos + rotate_half(rot) * sin, rest), dim=-1)


@pytest.mark.parametrize("kind", ["llama", "qwen3", "qwen3_5"])
def test_shifting_a_rotated_key_equals_rotating_it_at_the_later_position(kind):
    model = loaded_tiny(kind).model
    shift = rope_shift(model)
    head_dim = model.config.head_dim
    g = torch.Generator().manual_seed(1)
    raw = torch.randn(1, 2, 4, head_dim, generator=g, dtype=torch.float32)
    at = torch.tensor([0, 1, 2, 63])
    for delta in (1, 700):  # the model's rotary angles are fp32: exact only at small positions
        moved = shift.shift(rotated_at(model, raw, at), delta)
        torch.testing.assert_close(moved, rotated_at(model, raw, at + delta), atol=5e-5, rtol=0)
    # far away, against the same rotation in float64 (fp32 angles drift by ~1e-3 at 131K)
    delta = 131_000
    moved = shift.shift(rotated_at(model, raw.double(), at).float(), delta)
    freqs = (at + delta).double()[:, None] * shift.inv_freq.double()[None]
    emb = torch.cat((freqs, freqs), dim=-1)
    rd = shift.rotary_dim
    rot = raw.double()[..., :rd]
    direct = torch.cat((rot * emb.cos() + rotate_half(rot) * emb.sin(), raw.double()[..., rd:]), -1)
    torch.testing.assert_close(moved.double(), direct, atol=2e-5, rtol=0)
    if kind == "qwen3_5":  # partial rotary: the dims past the rotary ones never move
        assert shift.rotary_dim < head_dim
        torch.testing.assert_close(moved[..., shift.rotary_dim :], raw[..., shift.rotary_dim :])


def test_sink_delta_follows_the_querys_stride_and_stays_zero_before_window_plus_sink():
    spec = WindowSpec(sink=4, window=10, sink_positions="adjacent")
    assert [sink_delta(start, spec) for start in (0, 9, 10, 19, 20, 35)] == [0, 0, 0, 0, 7, 17]
    # every query of a stride reads the sinks within 2W + sink, and before its oldest key
    for p in range(200):
        d = sink_delta(p, spec)
        assert p - d < 2 * spec.window + spec.sink
        assert d + spec.sink <= max(0, p - spec.window + 1) or d == 0
    assert stride_cuts(5, 42, spec) == (10, 20, 30, 40)
    assert stride_cuts(5, 42, WindowSpec(sink=4, window=10)) == ()


def test_the_layer_moves_only_the_sinks_a_chunk_reads_and_keeps_them_as_first_rotated():
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))
    spec = WindowSpec(sink=2, window=4, sink_positions="adjacent")
    layer = SinkWindowLayer(spec, RopeShift(inv_freq))
    g = torch.Generator().manual_seed(0)
    chunks = [torch.randn(1, 1, 2, 8, generator=g) for _ in range(6)]  # 2 per 4-token stride
    all_keys = torch.cat(chunks, dim=-2)
    for i, chunk in enumerate(chunks):
        held_before = layer.positions.clone()
        keys, _ = layer.update(chunk, chunk.clone())
        read = torch.cat([held_before, torch.arange(2 * i, 2 * i + 2)])
        delta = sink_delta(2 * i, spec)
        torch.testing.assert_close(keys[..., 2:, :], all_keys[..., read[2:], :])
        torch.testing.assert_close(
            keys[..., :2, :], RopeShift(inv_freq).shift(all_keys[..., :2, :], delta)
        )
        torch.testing.assert_close(layer.keys[..., :2, :], all_keys[..., :2, :])  # no drift
    assert delta == 4 + 1 - 2  # the last stride [8, 12): sinks end before 8 - 4 + 1
    with pytest.raises(ValueError, match="straddles"):
        layer.update(torch.randn(1, 1, 5, 8), torch.randn(1, 1, 5, 8))  # [12, 17)


@pytest.mark.parametrize("kind", ["llama", "qwen3_5"])
def test_adjacent_sinks_change_nothing_while_the_window_covers_the_prompt(kind):
    req = request(90)
    absolute = windowed(kind, window=4096, sink=4)(req)
    adjacent = windowed(kind, window=4096, sink=4, drafter_sink_positions="adjacent")(req)
    np.testing.assert_array_equal(adjacent.mass, absolute.mass)


@pytest.mark.parametrize("kind", ["llama", "qwen3", "qwen3_5"])
def test_adjacent_sinks_change_the_scores_once_the_window_moves_on(kind):
    n = 600 if kind == "qwen3_5" else 400  # qwen3_5: attention layers are fewer, move further
    req = request(n)
    absolute = windowed(kind, window=24, sink=4)(req)
    adjacent = windowed(kind, window=24, sink=4, drafter_sink_positions="adjacent")(req)
    assert np.isfinite(adjacent.mass).all()
    # random weights attend almost uniformly, so the mass moves little; the trunk's states do
    assert np.abs(adjacent.tap - absolute.tap).max() > 1e-4
    np.testing.assert_allclose(adjacent.tap[:24], absolute.tap[:24], atol=1e-6, rtol=0)


@pytest.mark.parametrize("kind", ["llama", "qwen3_5"])
def test_a_resumed_session_with_adjacent_sinks_scores_like_a_fresh_pass(kind):
    one, two = turns(kind)
    adjacent = {"drafter_chunk_tokens": 32, "drafter_sink_positions": "adjacent"}
    scorer = windowed(kind, window=48, sink=4, **adjacent)
    scorer(one)
    resumed = scorer(two)
    assert resumed.scorer_resume > 0
    fresh = windowed(kind, window=48, sink=4, **adjacent)(
        ScoreRequest(**{**two.__dict__, "session_key": None})
    )
    np.testing.assert_allclose(resumed.mass, fresh.mass, atol=1e-6, rtol=0)
    np.testing.assert_allclose(resumed.tap, fresh.tap, atol=1e-5, rtol=0)
