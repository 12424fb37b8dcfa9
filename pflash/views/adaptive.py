"""The adaptive keep-ratio controller (ALGORITHM.md §6.6, the reference's "bandit").

Per conversation (`session_id`), the keep ratio r0 follows the target's **speculative
decoding acceptance**: when the target's own draft is accepted less often, the compressed
context is read as having lost something, so the next turn keeps more; high acceptance lets
it keep less. The signal is the target's, not a PFlash quality measure, so the controller
moves only when acceptance was actually reported (a target without speculative decoding
reports none, and the ratio stays the configured one).

`update_keep` is the pure rule; `AdaptiveKeep` holds the per-session states in an LRU. A
session's first turn uses the configured (or curve) ratio r0 as is; its first feedback
seeds the state from r0 clamped to [adaptive_min, adaptive_max] and already takes a step,
so a curve value outside the bounds collapses into them from then on (§12 item 11).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

from pflash.config import ViewsConfig

EMA_DECAY = 0.7  # ema = 0.7 ema + 0.3 accept
HIGH, VERY_HIGH = 0.85, 0.90  # acceptance above: keep less
LOW, VERY_LOW = 0.75, 0.70  # acceptance below: keep more
SMALL_STEP, BIG_STEP = 0.005, 0.01


@dataclass(frozen=True)
class AdaptiveState:
    """One session: `ema` of acceptance, `last_keep` the ratio its next turn uses,
    `turn_count` the feedback reports applied."""

    ema: float
    last_keep: float
    turn_count: int


def clamp(x: float, lo: float, hi: float) -> float:
    return min(hi, max(lo, x))


def update_keep(
    state: AdaptiveState | None, accept_rate: float, r0: float, lo: float, hi: float
) -> AdaptiveState:
    """One feedback step (§6.6 update).

    - ema = accept on the first report, else 0.7 ema + 0.3 accept;
    - ema > 0.85: keep -= 0.01 if ema > 0.90 else 0.005;
    - ema < 0.75: keep += 0.01 if ema < 0.70 else 0.005;
    - keep is clamped to [lo, hi]; a new session starts from clamp(r0, lo, hi).
    `accept_rate` must be finite and in [0, 1] (0 counts: nothing was accepted).
    """
    if not (math.isfinite(accept_rate) and 0.0 <= accept_rate <= 1.0):
        raise ValueError(f"accept_rate must be in [0, 1], got {accept_rate}")
    if state is None:
        ema, keep, turns = accept_rate, clamp(r0, lo, hi), 0
    else:
        ema = EMA_DECAY * state.ema + (1.0 - EMA_DECAY) * accept_rate
        keep, turns = state.last_keep, state.turn_count
    if ema > HIGH:
        keep -= BIG_STEP if ema > VERY_HIGH else SMALL_STEP
    elif ema < LOW:
        keep += BIG_STEP if ema < VERY_LOW else SMALL_STEP
    return AdaptiveState(ema=ema, last_keep=clamp(keep, lo, hi), turn_count=turns + 1)


def session_key(value: object) -> str | None:
    """The controller's key for a request's `session_id`: a non-empty string, else None
    (no adaptive ratio). A non-string id (e.g. an integer in extra_body) counts as absent,
    as in the reference (§10.2 item 31)."""
    return value if isinstance(value, str) and value else None


class AdaptiveKeep:
    """Per-session keep ratios, LRU-bounded to `capacity` sessions (not thread-safe).

    - `ratio(session, r0)`: the r0 this turn compresses with: the session's last_keep, or
      r0 when the session is unknown, has no feedback yet, or the controller is disabled.
    - `report(session, accept_rate, r0)`: apply one acceptance report, after generation.
      `accept_rate` None means speculative decoding did not run: no update.
    """

    def __init__(
        self, *, capacity: int = 1024, lo: float = 0.025, hi: float = 0.20, enabled: bool = True
    ) -> None:
        if capacity < 1 or not (0 < lo <= hi <= 1):
            raise ValueError(
                f"need capacity >= 1 and 0 < lo <= hi <= 1, got {capacity}, {lo}, {hi}"
            )
        self.capacity, self.lo, self.hi, self.enabled = capacity, lo, hi, enabled
        self._states: OrderedDict[str, AdaptiveState] = OrderedDict()

    @classmethod
    def from_config(cls, config: ViewsConfig) -> AdaptiveKeep:
        return cls(
            capacity=config.adaptive_sessions,
            lo=config.adaptive_min,
            hi=config.adaptive_max,
            enabled=config.adaptive_keep,
        )

    def __len__(self) -> int:
        return len(self._states)

    def state(self, session: str | None) -> AdaptiveState | None:
        return self._states.get(session) if session else None

    def ratio(self, session: str | None, r0: float) -> float:
        if not self.enabled or not session:
            return r0
        state = self._states.get(session)
        if state is None:
            return r0
        self._states.move_to_end(session)
        return state.last_keep

    def report(
        self, session: str | None, accept_rate: float | None, r0: float
    ) -> AdaptiveState | None:
        if not self.enabled or not session or accept_rate is None:
            return None
        state = update_keep(self._states.get(session), accept_rate, r0, self.lo, self.hi)
        self._states[session] = state
        self._states.move_to_end(session)
        while len(self._states) > self.capacity:
            self._states.popitem(last=False)
        return state
