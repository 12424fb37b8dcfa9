"""The adaptive keep-ratio controller (ALGORITHM §6.6 tests, §10.3 item 36)."""

from __future__ import annotations

import pytest

from pflash.config import build_config
from pflash.views.adaptive import AdaptiveKeep, AdaptiveState, session_key, update_keep

R0 = 0.10


def test_unknown_session_gets_the_configured_ratio_unclamped():
    ctl = AdaptiveKeep()
    assert ctl.ratio("new", R0) == R0
    assert ctl.ratio("new", 0.5) == 0.5  # the first turn uses r0 as is (§12 item 11)
    assert ctl.ratio(None, R0) == R0


def test_first_report_sets_ema_to_the_observed_acceptance():
    ctl = AdaptiveKeep()
    state = ctl.report("s", 0.82, R0)
    assert state.ema == pytest.approx(0.82)
    assert state.turn_count == 1
    assert state.last_keep == R0  # 0.75 <= 0.82 <= 0.85: no step
    assert ctl.ratio("s", 0.05) == R0


def test_second_report_blends_ema_seventy_thirty():
    ctl = AdaptiveKeep()
    ctl.report("s", 0.82, R0)
    state = ctl.report("s", 0.40, R0)
    assert state.ema == pytest.approx(0.7 * 0.82 + 0.3 * 0.40)
    assert state.turn_count == 2


def test_high_acceptance_lowers_keep_monotonically_over_ten_turns():
    ctl = AdaptiveKeep()
    keeps = [ctl.report("s", 0.95, 0.20).last_keep for _ in range(10)]
    assert all(b < a for a, b in zip(keeps, keeps[1:], strict=False))
    assert keeps[-1] == pytest.approx(0.20 - 10 * 0.01)
    # from a lower seed it falls to the floor and stays there
    keeps = [ctl.report("t", 0.95, R0).last_keep for _ in range(10)]
    assert all(b <= a for a, b in zip(keeps, keeps[1:], strict=False))
    assert keeps[-1] == 0.025


@pytest.mark.parametrize(
    "accept,step",
    [(0.95, -0.01), (0.88, -0.005), (0.80, 0.0), (0.85, 0.0), (0.72, 0.005), (0.60, 0.01)],
)
def test_step_size_follows_the_ema_bands(accept, step):
    state = update_keep(None, accept, R0, 0.025, 0.20)
    assert state.last_keep == pytest.approx(R0 + step)


def test_bounds_hold_after_a_hundred_turns():
    ctl = AdaptiveKeep()
    for _ in range(100):
        low = ctl.report("up", 0.0, R0).last_keep
        high = ctl.report("down", 1.0, R0).last_keep
    assert low == 0.20 and high == 0.025


def test_zero_acceptance_raises_keep():
    state = AdaptiveKeep().report("s", 0.0, R0)
    assert state.ema == 0.0 and state.last_keep == pytest.approx(R0 + 0.01)


def test_sessions_are_isolated():
    ctl = AdaptiveKeep()
    ctl.report("a", 0.95, R0)
    ctl.report("b", 0.10, R0)
    assert ctl.ratio("a", R0) == pytest.approx(0.09)
    assert ctl.ratio("b", R0) == pytest.approx(0.11)
    assert ctl.ratio("c", R0) == R0


def test_lru_keeps_at_most_capacity_sessions():
    ctl = AdaptiveKeep(capacity=1024)
    for i in range(1100):
        ctl.report(f"s{i}", 0.8, R0)
    assert len(ctl) == 1024
    assert ctl.state("s0") is None and ctl.state("s1099") is not None
    small = AdaptiveKeep(capacity=2)
    small.report("a", 0.8, R0)
    small.report("b", 0.8, R0)
    small.ratio("a", R0)  # reading refreshes a
    small.report("c", 0.8, R0)
    assert small.state("a") is not None and small.state("b") is None


def test_seed_is_the_configured_ratio_clamped_to_the_bounds():
    assert update_keep(None, 0.8, 0.5, 0.025, 0.20).last_keep == 0.20
    assert update_keep(None, 0.8, 0.001, 0.025, 0.20).last_keep == 0.025
    assert update_keep(None, 0.95, 0.5, 0.025, 0.20).last_keep == pytest.approx(0.19)


def test_no_update_without_reported_acceptance():
    ctl = AdaptiveKeep()
    assert ctl.report("s", None, R0) is None
    assert ctl.state("s") is None and ctl.ratio("s", 0.07) == 0.07


def test_integer_session_id_means_no_adaptive_ratio():
    ctl = AdaptiveKeep()
    key = session_key(12345)
    assert key is None and session_key("") is None and session_key("abc") == "abc"
    assert ctl.report(key, 0.95, R0) is None and len(ctl) == 0


def test_disabled_controller_keeps_the_configured_ratio():
    ctl = AdaptiveKeep.from_config(build_config({"adaptive_keep": False}, env={}))
    assert ctl.report("s", 0.95, R0) is None and ctl.ratio("s", R0) == R0


def test_from_config_uses_the_configured_bounds_and_capacity():
    cfg = build_config({"adaptive_min": 0.05, "adaptive_max": 0.3, "adaptive_sessions": 7}, env={})
    ctl = AdaptiveKeep.from_config(cfg)
    assert (ctl.capacity, ctl.lo, ctl.hi) == (7, 0.05, 0.3)
    assert ctl.report("s", 0.0, 0.9).last_keep == 0.3


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan")])
def test_acceptance_outside_zero_one_is_rejected(bad):
    with pytest.raises(ValueError):
        update_keep(AdaptiveState(0.8, R0, 1), bad, R0, 0.025, 0.20)


# --------------------------------------------------------------------------- in the flow

DOCUMENT = " ".join(f"Clause {i} says the licensee keeps the notice intact." for i in range(300))
# views off: each request here is compressed afresh, so its budget ratio shows in its stats
FLOW = dict(mode="always", keep_ratio=0.1, chat_view=False, select_semantic_weight=0.0)


def _budget_ratio(tokenizer, adaptive: AdaptiveKeep, **fields) -> float:
    """The keep ratio (`usage.timings.pflash.budget_ratio`, r0 over droppable tokens) a
    chat request is compressed with, through the flow the ingress runs
    (`with_request_overrides`, `compression_request`, `Compressor.run`)."""
    import numpy as np

    from pflash.compress.scoring import ScoreResult
    from pflash.flow.compressor import Compressor
    from pflash.flow.in_process import LocalStore, local_scorer
    from pflash.flow.request import compression_request, render_request
    from pflash.serving.admission import request_params
    from pflash.serving.chat_completion.serving import parse_chat_request
    from pflash.views.store import ViewStore

    def uniform(request):
        return ScoreResult(mass=np.full(len(request.ids), 1.0 / len(request.ids), np.float32))

    config = build_config(FLOW, env={})
    compressor = Compressor(
        target_tokenizer=tokenizer,
        drafter_tokenizer=tokenizer,
        scorer=local_scorer(uniform),
        store=LocalStore(ViewStore.from_config(config), adaptive),
        max_context=8192,
    )
    body = {"messages": [{"role": "user", "content": DOCUMENT + "\n\nWhat is kept?"}], **fields}
    req = parse_chat_request(body)
    config = config.with_request_overrides(mode=req.pflash_mode, keep_ratio=req.pflash_keep_ratio)
    job = compression_request(
        req, render_request(req, "chat", tokenizer), config, "tenant-a", request_params(req, config)
    )
    return compressor.run_sync(job).stats["budget_ratio"]


def _moved_controller() -> AdaptiveKeep:
    """A controller whose session "s1" (tenant-a) was moved to its floor by high acceptance."""
    ctl = AdaptiveKeep.from_config(build_config(FLOW, env={}))
    for _ in range(20):
        ctl.report("tenant-a:s1", 0.95, 0.1)
    assert ctl.ratio("tenant-a:s1", 0.1) == 0.025
    return ctl


def test_an_explicit_keep_ratio_is_honoured_with_a_session_id(smollm2_tokenizer):
    ctl = _moved_controller()
    assert _budget_ratio(smollm2_tokenizer, ctl, pflash_keep_ratio=0.3) == 0.3
    assert _budget_ratio(smollm2_tokenizer, ctl, session_id="s1", pflash_keep_ratio=0.3) == 0.3


def test_the_controller_moves_the_server_default_ratio_of_a_session(smollm2_tokenizer):
    ctl = _moved_controller()
    assert _budget_ratio(smollm2_tokenizer, ctl, session_id="s1") == 0.025
    assert _budget_ratio(smollm2_tokenizer, ctl) == 0.1  # the server's ratio, unmoved
    assert _budget_ratio(smollm2_tokenizer, ctl, session_id="other") == 0.1
